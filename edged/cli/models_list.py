"""`edged models list` (also `edged list`): the store's complete entries, a table or JSON."""

from __future__ import annotations

import json

import click


def human_size(n: int) -> str:
    from edged.cli.info import _human

    return _human(n)


def human_params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def modified(created: str) -> str:
    return created.replace("T", " ")[:16]  # ISO 8601 UTC -> "YYYY-MM-DD HH:MM"


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of manifests.")
def command(as_json: bool) -> None:
    """List the models in the store ($EDGED_MODELS, default ~/.local/share/edged/models)."""
    from edged.store import ModelStore

    store = ModelStore()
    entries = store.list()
    if as_json:
        click.echo(json.dumps([m.to_dict() for m in entries], indent=2))
        return
    rows = [("NAME", "SIZE", "ARCH", "PARAMS", "QUANT", "MODIFIED")]
    rows += [(m.name, human_size(m.size), m.architecture, human_params(m.parameters), m.quantization,
              modified(m.created)) for m in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if not entries:
        click.echo(f"(no models in {store.root}; `edged pull smollm2-135m-instruct` or "
                   "`edged models import PATH`)", err=True)
