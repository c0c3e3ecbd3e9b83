"""`edged chat [MODEL]`: an interactive terminal chat, as `ollama run`, with a model loaded in this
process or (--url) with a running server. The loop is edged.cli.chat_repl, the two backends
edged.cli.chat_backends."""

from __future__ import annotations

import click

from edged.cli.options import backend_options, kv_type_option, model_argument, sampling_options


@click.command("chat")
@model_argument
@click.option("--url", default=None, help="Chat with a running OpenAI-compatible server at URL "
              "(e.g. http://127.0.0.1:8080) instead of loading MODEL here.")
@click.option("--api-key", envvar="EDGED_API_KEY", default=None,
              help="Bearer token for --url (default: $EDGED_API_KEY).")
@click.option("--system", default=None, help="The system message (change it later with /system TEXT).")
@sampling_options(max_tokens=None)
@click.option("--ctx", type=int, default=4096, show_default=True,
              help="Context length (tokens) of the in-process model: the history and the reply.")
@click.option("--chat-template", default=None, help="Built-in template name or Jinja source.")
@click.option("--verbose", is_flag=True, help="After each reply, its token counts and speed (stderr).")
@backend_options
@kv_type_option
def command(model, url, api_key, system, max_tokens, temperature, top_k, top_p, min_p, seed, ctx,
            chat_template, verbose, backend, gpu_layers, kv_type):
    """Chat with a model in the terminal: /? for the commands, Ctrl-C stops a reply, /bye leaves.

    MODEL is a store name or a .gguf path (default: the store's default chat model). Reads plain
    lines, without prompts, when stdin is not a terminal."""
    from edged.cli.chat_backends import ChatError, Settings
    from edged.cli.chat_repl import ChatSession, LineReader
    from edged.sampling import SamplingParams

    if max_tokens is not None and max_tokens < 1:
        raise click.BadParameter("must be at least 1", param_hint="--max-tokens")
    try:  # the same checks as every other request: fail before loading anything
        SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    settings = Settings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                        max_tokens=max_tokens)
    reader = LineReader()
    try:
        chat_backend = _http_backend(url, api_key, model) if url else _engine_backend(
            model, chat_template, ctx, backend, gpu_layers, kv_type)
    except ChatError as e:
        raise click.ClickException(str(e)) from None
    try:
        if reader.interactive:
            click.echo(f"edged chat with {chat_backend.name}: /? for help, /bye or Ctrl-D to leave", err=True)
        session = ChatSession(chat_backend, settings, system=system, verbose=verbose,
                              interactive=reader.interactive)
        session.run(reader)
    finally:
        chat_backend.close()
    if session.failed_turns and not reader.interactive:  # a script learns that a turn failed
        raise click.exceptions.Exit(1)


def _http_backend(url, api_key, model):
    from edged.cli.chat_backends import HTTPBackend

    if not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r} is not an http:// or https:// URL", param_hint="--url")
    return HTTPBackend(url, api_key, model)


def _engine_backend(model, chat_template, ctx, backend, gpu_layers, kv_type):
    from edged.cli.chat_backends import EngineBackend
    from edged.cli.run import _load
    from edged.loader import load

    if ctx < 16:
        raise click.BadParameter("must be at least 16", param_hint="--ctx")
    lm = _load(load, model, chat_template=chat_template, backend=backend, gpu_layers=gpu_layers, kv_tokens=ctx,
               kv_type=kv_type)
    return EngineBackend(lm, ctx)

