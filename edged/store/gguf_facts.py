"""What a manifest records about a model, read from its validated GGUF header."""

from __future__ import annotations

from pathlib import Path

from edged.store.errors import StoreError


def validated_facts(path: Path, shown_as: str | None = None) -> dict:
    """Validates the GGUF at `path` (all parts of a split model) and returns the manifest's model
    fields. StoreError naming the file (`shown_as`, default the path) when it is not a valid GGUF."""
    from edged.cli.info import model_summary  # the one place that computes these (also `edged info`)
    from edged.quant import GGUFError, load_gguf

    try:
        with load_gguf(path) as gf:
            s = model_summary(gf)
            chat_template = "tokenizer.chat_template" in gf
            file_type = _file_type_name(gf.get_int("general.file_type", None))
            parts = [Path(p) for p in gf.paths]
    except GGUFError as e:  # its message names the file (and field, offset): show the file as the user knows it
        msg = str(e).replace(e.path, shown_as) if shown_as else str(e)
        raise StoreError(f"not a valid GGUF model: {msg}") from None
    except OSError as e:
        raise StoreError(f"cannot read {shown_as or path}: {e}") from None
    ctx = s["context_length"]
    return {
        "parts": parts,
        "architecture": s["architecture"],
        "parameters": int(s["parameters"]),
        "tensor_types": {t: h["count"] for t, h in s["tensor_types"].items()},
        "context_length": int(ctx) if isinstance(ctx, int) else 0,
        "chat_template": chat_template,
        "file_type": file_type,
    }


def _file_type_name(value: int | None) -> str:
    """llama.cpp's name of a general.file_type ("Q4_K_M", "F16"); "" when absent or unknown."""
    import gguf

    try:
        name = gguf.LlamaFileType(value).name if value is not None else ""
    except ValueError:
        return ""
    return "" if name == "GUESSED" else name.removeprefix("MOSTLY_").removeprefix("ALL_")
