"""`edged info [MODEL] [--json]`: what a GGUF model is, read from its validated header."""

from __future__ import annotations

import json

import click

from edged.model_path import resolve_model_path


def model_summary(gf) -> dict:
    """Architecture, size and shape facts of a loaded GGUFFile, as plain JSON-able values."""
    import numpy as np

    def num(key):
        v = gf.get_int_or_array(gf.arch_key(key), None)
        return v.tolist() if isinstance(v, np.ndarray) else v

    types: dict[str, dict[str, int]] = {}
    n_params = 0
    for t in gf.tensors.values():
        n = 1
        for d in t.shape:
            n *= d
        n_params += n
        h = types.setdefault(t.qtype.name, {"count": 0, "bytes": 0})
        h["count"] += 1
        h["bytes"] += int(t.data.nbytes)
    return {
        "path": str(gf.path),
        "parts": len(gf.paths),
        "gguf_version": gf.version,
        "architecture": gf.architecture,
        "name": gf.get_str("general.name", None),
        "parameters": n_params,
        "context_length": num("context_length"),
        "layers": num("block_count"),
        "embedding_length": num("embedding_length"),
        "heads": num("attention.head_count"),
        "heads_kv": num("attention.head_count_kv"),
        "file_size": gf.file_size,
        "tensor_count": len(gf.tensors),
        "tensor_types": dict(sorted(types.items(), key=lambda kv: -kv[1]["bytes"])),
    }


def _human(n_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:.2f} {unit}" if unit != "B" else f"{n_bytes} B"
        n_bytes /= 1024
    return ""  # pragma: no cover


def _fmt(v) -> str:
    return "-" if v is None else str(v)


def _print_text(s: dict) -> None:
    heads = _fmt(s["heads"]) + (f" (kv {s['heads_kv']})" if s["heads_kv"] is not None else "")
    rows = [
        ("model", s["path"] + (f" (+{s['parts'] - 1} split parts)" if s["parts"] > 1 else "")),
        ("architecture", s["architecture"]),
        ("name", _fmt(s["name"])),
        ("parameters", f"{s['parameters'] / 1e6:.2f} M ({s['parameters']:,})"),
        ("context length", _fmt(s["context_length"])),
        ("layers", _fmt(s["layers"])),
        ("embedding size", _fmt(s["embedding_length"])),
        ("heads", heads),
        ("file size", f"{_human(s['file_size'])} ({s['file_size']:,} bytes)"),
        ("tensors", str(s["tensor_count"])),
    ]
    for k, v in rows:
        click.echo(f"{k:<15} {v}")
    click.echo(f"  {'type':<8} {'count':>6} {'bytes':>14}")
    for name, h in s["tensor_types"].items():
        click.echo(f"  {name:<8} {h['count']:>6} {h['bytes']:>14,}  ({_human(h['bytes'])})")


@click.command("info")
@click.argument("model", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(model: str | None, as_json: bool) -> None:
    """Show a GGUF model's architecture, size and tensor types (MODEL defaults to the installed
    Gemma 3 270M Q4_K_M)."""
    from edged.quant import GGUFError, load_gguf

    path = resolve_model_path(model)
    try:
        gf = load_gguf(path)
        summary = model_summary(gf)
    except GGUFError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(summary))
    else:
        _print_text(summary)
