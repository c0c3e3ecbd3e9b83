"""`edged` command line: one click group; each command lives in its own module here."""

import importlib

from edged.malloc_policy import keep_freed_memory

keep_freed_memory()  # before the engine's first step

import click  # noqa: E402

# command name -> module under edged.cli defining a click command called `command`
_COMMANDS = {
    "bench": "bench",
    "bundle": "bundle",
    "chat": "chat",
    "info": "info",
    "list": "models_list",
    "models": "models",
    "perplexity": "perplexity",
    "ps": "ps",
    "pull": "pull",
    "run": "run",
    "serve": "serve",
}


class _LazyGroup(click.Group):
    """Imports a command's module only when that command runs (keeps `edged --help` fast)."""

    def list_commands(self, ctx):
        return sorted(_COMMANDS)

    def get_command(self, ctx, name):
        mod = _COMMANDS.get(name)
        if mod is None:
            return None
        return importlib.import_module(f"edged.cli.{mod}").command


@click.group(cls=_LazyGroup)
@click.version_option(package_name="edged")
def main():
    """edged: local LLM inference daemon for GGUF models."""
