"""One store entry's manifest: what the model is and which blobs hold it (JSON on disk)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from edged.store.errors import StoreError

FORMAT = 1  # bumped when the on-disk layout of a manifest changes incompatibly
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# file names become link names inside the store: a plain name, never a path
_FILE_NAME = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._+-]{0,254}$")


@dataclass(frozen=True)
class Manifest:
    """A complete store entry. `files` are in split order; each {"name", "sha256", "size"}."""

    name: str  # "name:tag"
    files: tuple
    size: int  # bytes, all parts
    architecture: str
    parameters: int
    tensor_types: dict  # {"Q4_K": 120, "F32": 40, ...}: tensor counts per type
    context_length: int
    chat_template: bool
    source: dict  # {"kind": "pull", "package": ...} or {"kind": "import", "path": ...}
    created: str  # ISO 8601 UTC
    file_type: str = ""  # general.file_type as llama.cpp names it ("Q4_K_M"); "" when the file has none
    extra: dict = field(default_factory=dict, compare=False)  # unknown keys of newer writers, kept

    @property
    def quantization(self) -> str:
        """The file type ("Q4_K_M"), else the most used tensor type other than F32 (the norms)."""
        if self.file_type:
            return self.file_type
        counts = {t: n for t, n in self.tensor_types.items() if t != "F32"} or self.tensor_types
        return max(sorted(counts), key=lambda t: counts[t]) if counts else "-"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        d["files"] = [dict(f) for f in self.files]
        return d

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **self.extra, **self.to_dict()}, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict, where: str = "manifest") -> "Manifest":
        """Checked construction: StoreError naming `where` and the field for anything malformed."""
        if not isinstance(d, dict):
            raise StoreError(f"{where}: not a JSON object")
        if d.get("format", FORMAT) != FORMAT:
            raise StoreError(f"{where}: format {d.get('format')!r}, this edged reads format {FORMAT}")

        def get(key, kind):
            v = d.get(key)
            if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
                raise StoreError(f"{where}: field {key!r} missing or not {getattr(kind, '__name__', kind)}")
            return v

        files = get("files", list)
        if not files:
            raise StoreError(f"{where}: field 'files' is empty")
        for i, f in enumerate(files):
            ok = (isinstance(f, dict) and isinstance(f.get("name"), str) and _FILE_NAME.match(f["name"])
                  and isinstance(f.get("sha256"), str) and _HEX64.match(f["sha256"])
                  and isinstance(f.get("size"), int) and f["size"] > 0)
            if not ok:
                raise StoreError(f"{where}: files[{i}] needs a plain 'name', a 64-hex 'sha256' and a 'size' > 0")
        types = get("tensor_types", dict)
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in types.items()):
            raise StoreError(f"{where}: field 'tensor_types' must map type names to counts")
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        return cls(
            name=get("name", str),
            files=tuple({"name": f["name"], "sha256": f["sha256"], "size": f["size"]} for f in files),
            size=get("size", int),
            architecture=get("architecture", str),
            parameters=get("parameters", int),
            tensor_types=dict(types),
            context_length=get("context_length", int),
            chat_template=get("chat_template", bool),
            source=get("source", dict),
            created=get("created", str),
            file_type=d["file_type"] if isinstance(d.get("file_type"), str) else "",
            extra={k: v for k, v in d.items() if k not in known and k != "format"},
        )

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> "Manifest":
        try:
            d = json.loads(text)
        except ValueError as e:
            raise StoreError(f"{where}: not valid JSON ({e})") from None
        return cls.from_dict(d, where)
