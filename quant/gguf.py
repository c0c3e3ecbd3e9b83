"""Validated GGUF loading: `load_gguf(path) -> GGUFFile`.

Each file (or every part of a split model `name-00001-of-00003.gguf`) is fully validated by
`gguf_parse.parse_file` before any tensor is exposed. Tensors are zero-copy views of read-only
mmaps, which stay alive as long as any tensor's `data` is referenced.

Other layers read metadata only through the typed accessors (`get_str`, `get_int`, ...), which check
the stored GGUF value type and raise GGUFError naming the key, expected and stored types.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType

from edged.quant.errors import GGUFError
from edged.quant.gguf_parse import ParsedFile, parse_file
from edged.quant.tensor import QTensor

_V = GGUFValueType
_INT_TYPES = frozenset({_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32, _V.UINT64, _V.INT64})
_FLOAT_TYPES = frozenset({_V.FLOAT32, _V.FLOAT64})
_NUMERIC_TYPES = _INT_TYPES | _FLOAT_TYPES | {_V.BOOL}
_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_MISSING = object()

# Keys validated at load time (before any model code runs): key -> accepted stored types.
# "{arch}" is replaced with general.architecture.
_LOAD_SCHEMA: dict[str, tuple[str, ...]] = {
    "general.architecture": ("str",),
    "general.name": ("str",),
    "general.file_type": ("int",),
    "general.quantization_version": ("int",),
    "split.no": ("int",),
    "split.count": ("int",),
    "split.tensors.count": ("int",),
    "tokenizer.ggml.model": ("str",),
    "tokenizer.ggml.pre": ("str",),
    "tokenizer.ggml.tokens": ("str_list",),
    "tokenizer.ggml.merges": ("str_list",),
    "tokenizer.ggml.scores": ("array",),
    "tokenizer.ggml.token_type": ("array",),
    "tokenizer.chat_template": ("str",),
    "{arch}.context_length": ("int",),
    "{arch}.embedding_length": ("int",),
    "{arch}.block_count": ("int",),
    "{arch}.feed_forward_length": ("int", "array"),
    "{arch}.attention.head_count": ("int", "array"),
    "{arch}.attention.head_count_kv": ("int", "array"),
}


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return f"ARRAY of {t[1].name}"
    return t.name


class GGUFFile:
    """A validated GGUF model (one file, or all parts of a split model).

    Attributes:
        path: first (or only) file; `paths` lists every part.
        version: GGUF version of the first part (2 or 3).
        metadata: key -> value. Scalars are int/float/bool/str, string arrays list[str], numeric
            arrays read-only numpy arrays viewing the mmap, arrays of arrays lists.
        metadata_types: key -> GGUFValueType, or (GGUFValueType.ARRAY, element type) for arrays.
        tensors: name -> QTensor (shape in numpy order, data a zero-copy uint8 view).
        architecture: general.architecture.
        alignment: general.alignment of the first part (default 32).
        file_size: total bytes over all parts.
    """

    def __init__(self, parts: list[ParsedFile]):
        first = parts[0]
        self.path: Path = first.path
        self.paths: list[Path] = [p.path for p in parts]
        self.version: int = first.version
        self.metadata: dict[str, Any] = first.metadata
        self.metadata_types: dict[str, Any] = first.metadata_types
        self._kv_offsets = first.kv_offsets
        self.alignment: int = first.alignment
        self.file_size: int = sum(p.file_size for p in parts)
        self.tensors: dict[str, QTensor] = {}
        self._buffers = [p.buffer for p in parts]
        for part in parts:
            for ti in part.tensor_infos:
                if ti.name in self.tensors:
                    raise GGUFError(part.path, f"tensor '{ti.name}'", "name already used by another split part", ti.info_offset)
                start = part.data_offset + ti.offset
                self.tensors[ti.name] = QTensor(
                    name=ti.name,
                    qtype=ti.qtype,
                    shape=tuple(reversed(ti.dims)),  # GGUF lists dims fastest-first
                    data=part.buffer[start : start + ti.n_bytes],
                )
        self._validate_schema()
        self.architecture: str = self.get_str("general.architecture")

    # ---- typed accessors -------------------------------------------------------------------

    def _lookup(self, key: str, default, expected: str, ok) -> Any:
        if key not in self.metadata:
            if default is _MISSING:
                raise GGUFError(self.path, key, f"required key is missing (expected {expected})")
            return default
        t = self.metadata_types[key]
        if not ok(t):
            raise GGUFError(self.path, key, f"stored as {_type_name(t)}, expected {expected}", self._kv_offsets.get(key))
        return self.metadata[key]

    def get_str(self, key: str, default=_MISSING) -> str:
        """A STRING value."""
        return self._lookup(key, default, "STRING", lambda t: t == _V.STRING)

    def get_int(self, key: str, default=_MISSING) -> int:
        """Any integer type (not BOOL) as a Python int."""
        return self._lookup(key, default, "an integer type", lambda t: t in _INT_TYPES)

    def get_float(self, key: str, default=_MISSING) -> float:
        """FLOAT32/FLOAT64, or any integer type, as a Python float."""
        v = self._lookup(key, default, "FLOAT32/FLOAT64 or an integer type", lambda t: t in _FLOAT_TYPES or t in _INT_TYPES)
        return v if v is default else float(v)

    def get_bool(self, key: str, default=_MISSING) -> bool:
        """A BOOL value."""
        return self._lookup(key, default, "BOOL", lambda t: t == _V.BOOL)

    def get_str_list(self, key: str, default=_MISSING) -> list[str]:
        """An ARRAY of STRING as list[str]."""
        return self._lookup(key, default, "ARRAY of STRING", lambda t: t == (_V.ARRAY, _V.STRING))

    def get_array(self, key: str, default=_MISSING) -> np.ndarray:
        """An ARRAY of a numeric (or BOOL) type as a read-only numpy array (zero-copy)."""
        return self._lookup(key, default, "ARRAY of a numeric type", lambda t: isinstance(t, tuple) and t[1] in _NUMERIC_TYPES)

    def get_int_or_array(self, key: str, default=_MISSING) -> int | np.ndarray:
        """An integer, or a numeric array (per-layer values such as head_count in some models)."""
        return self._lookup(
            key,
            default,
            "an integer type or ARRAY of integers",
            lambda t: t in _INT_TYPES or (isinstance(t, tuple) and t[1] in _INT_TYPES),
        )

    def arch_key(self, suffix: str) -> str:
        """f"{architecture}.{suffix}", e.g. arch_key("context_length") -> "gemma3.context_length"."""
        return f"{self.architecture}.{suffix}"

    def __contains__(self, key: str) -> bool:
        return key in self.metadata

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Drops this object's references; each mmap closes once no tensor view still uses it."""
        self.tensors = {}
        self.metadata = {}
        self._buffers = []

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, arch={self.architecture!r}, tensors={len(self.tensors)}, parts={len(self.paths)})"

    # ---- load-time checks ------------------------------------------------------------------

    def _validate_schema(self) -> None:
        checks = {
            "str": lambda t: t == _V.STRING,
            "int": lambda t: t in _INT_TYPES,
            "str_list": lambda t: t == (_V.ARRAY, _V.STRING),
            "array": lambda t: isinstance(t, tuple) and t[1] in _NUMERIC_TYPES,
        }
        arch = self.get_str("general.architecture")
        for pattern, kinds in _LOAD_SCHEMA.items():
            key = pattern.replace("{arch}", arch)
            if key in self.metadata_types:
                t = self.metadata_types[key]
                if not any(checks[k](t) for k in kinds):
                    expected = " or ".join(kinds)
                    raise GGUFError(self.path, key, f"stored as {_type_name(t)}, expected {expected}", self._kv_offsets.get(key))


def split_part_paths(path: Path) -> list[Path] | None:
    """All part paths if `path` is named like a split part (`name-00002-of-00003.gguf`), else None."""
    m = _SPLIT_RE.match(path.name)
    if m is None:
        return None
    count = int(m.group("count"))
    if count < 1 or not 1 <= int(m.group("no")) <= count:
        return None
    prefix = m.group("prefix")
    return [path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def load_gguf(path: str | os.PathLike) -> GGUFFile:
    """Opens and validates a GGUF model; loading any part of a split model loads all its parts.

    Raises GGUFError (file, field, byte offset) for anything malformed or unsupported.
    """
    path = Path(path)
    part_paths = split_part_paths(path)
    if part_paths is None:
        parsed = parse_file(path)
        gf = GGUFFile([parsed])
        n = gf.get_int("split.count", 1)
        if n != 1:
            raise GGUFError(path, "split.count", f"file is part of a {n}-part split model but is not named like '<name>-00001-of-{n:05d}.gguf'")
        return gf

    for p in part_paths:
        if not p.exists():
            raise GGUFError(p, "split", f"missing part {p.name} of the split model ({len(part_paths)} parts)")
    parts = [parse_file(p) for p in part_paths]
    _check_split_metadata(parts)
    return GGUFFile(parts)


def _split_int(part: ParsedFile, key: str) -> int | None:
    if key not in part.metadata:
        return None
    t = part.metadata_types[key]
    if t not in _INT_TYPES:
        raise GGUFError(part.path, key, f"stored as {_type_name(t)}, expected an integer type", part.kv_offsets[key])
    return part.metadata[key]


def _check_split_metadata(parts: list[ParsedFile]) -> None:
    """split.count / split.no / split.tensors.count, where present, must agree with the file names."""
    count = len(parts)
    for i, part in enumerate(parts):
        declared = _split_int(part, "split.count")
        if declared is not None and declared != count:
            raise GGUFError(part.path, "split.count", f"{declared} parts declared, file names say {count}", part.kv_offsets["split.count"])
        no = _split_int(part, "split.no")
        if no is not None and no != i:
            raise GGUFError(part.path, "split.no", f"is {no}, expected {i} for part {i + 1} of {count}", part.kv_offsets["split.no"])
    total = _split_int(parts[0], "split.tensors.count")
    held = sum(len(p.tensor_infos) for p in parts)
    if total is not None and total != held:
        raise GGUFError(parts[0].path, "split.tensors.count", f"{total} tensors declared, parts hold {held}", parts[0].kv_offsets["split.tensors.count"])
