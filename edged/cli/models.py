"""`edged models list|show|rm|import`: the model store (docs/MODELS.md)."""

from __future__ import annotations

import json

import click

from edged.cli import models_list
from edged.cli.models_list import human_params, human_size, modified


def _store():
    from edged.store import ModelStore

    return ModelStore()


@click.group("models")
def command() -> None:
    """Models in the store: list, show, rm, import (and `edged pull NAME`)."""


command.add_command(models_list.command, "list")


@command.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as one JSON object.")
def show(name: str, as_json: bool) -> None:
    """Show a stored model's manifest."""
    from edged.store import StoreError

    store = _store()
    try:
        m = store.get(name)
        path = store.resolve(name)
    except StoreError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(m.to_dict(), indent=2))
        return
    rows = [
        ("name", m.name),
        ("path", str(path)),
        ("architecture", m.architecture),
        ("parameters", f"{human_params(m.parameters)} ({m.parameters:,})"),
        ("context length", str(m.context_length)),
        ("chat template", "yes" if m.chat_template else "no (ChatML is used)"),
        ("size", f"{human_size(m.size)} ({m.size:,} bytes)"),
        ("file type", m.file_type or "-"),
        ("tensor types", ", ".join(f"{t} {n}" for t, n in sorted(m.tensor_types.items(), key=lambda kv: -kv[1]))),
        ("source", ", ".join(f"{k}={', '.join(v) if isinstance(v, list) else v}" for k, v in m.source.items())),
        ("created", modified(m.created) + " UTC"),
    ]
    for k, v in rows:
        click.echo(f"{k:<15} {v}")
    for f in m.files:
        click.echo(f"  {f['name']}  {f['size']:,} bytes  sha256:{f['sha256']}")


@command.command("rm")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
def rm(names: tuple) -> None:
    """Remove models from the store (their blobs too, unless another model uses them)."""
    from edged.store import StoreError

    store = _store()
    for name in names:
        try:
            store.remove(name)
        except StoreError as e:
            raise click.ClickException(str(e)) from None
        click.echo(f"removed {store_name(name)}")


@command.command("import")
@click.argument("path", type=click.Path(dir_okay=False, path_type=str))
@click.option("--name", default=None, help="Store name[:tag] (default: the file name, lower-cased, :latest).")
def import_(path: str, name: str | None) -> None:
    """Copy a local GGUF file (any part of a split model brings all its parts) into the store,
    validated first."""
    from edged.cli.transfer_progress import TransferProgress
    from edged.store import StoreError

    store = _store()
    try:
        with TransferProgress(f"importing {name or path}") as p:
            m = store.import_path(path, name=name, progress=p)
    except StoreError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"imported {m.name} ({human_size(m.size)}, {m.architecture}, {human_params(m.parameters)} "
               f"parameters, {len(m.files)} file{'s' * (len(m.files) > 1)})")


def store_name(text: str) -> str:
    from edged.store import full_name

    return full_name(text)
