"""Validating parser for one GGUF file (one part of a split model).

Reads the header, the key/value metadata and the tensor infos straight from a read-only mmap with
`struct`, checking every count, length, type and offset against the bytes that remain before
trusting it. Anything wrong raises GGUFError; no other exception may escape (the callers' fuzz
tests hold this module to that). Layout (little-endian, versions 2 and 3):

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x  (string key | u32 value_type | value)
    n_tensors x (string name | u32 n_dims | u64 dims[n_dims] (fastest first) | u32 type | u64 offset)
    padding to `general.alignment` | tensor data (offsets relative to here)

where string = u64 length + UTF-8 bytes and an array value = u32 elem_type | u64 count | elements.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from edged.quant.errors import GGUFError
from edged.quant.types import TYPE_TRAITS

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
MAX_DIMS = 4
# An array may hold arrays, but no deeper: nothing in GGUF uses more, and it bounds recursion.
MAX_ARRAY_DEPTH = 2

_V = GGUFValueType
# value type -> (struct format, size in bytes, numpy dtype of an array of them)
_SCALARS: dict[GGUFValueType, tuple[str, int, str]] = {
    _V.UINT8: ("<B", 1, "u1"),
    _V.INT8: ("<b", 1, "i1"),
    _V.UINT16: ("<H", 2, "<u2"),
    _V.INT16: ("<h", 2, "<i2"),
    _V.UINT32: ("<I", 4, "<u4"),
    _V.INT32: ("<i", 4, "<i4"),
    _V.FLOAT32: ("<f", 4, "<f4"),
    _V.BOOL: ("<B", 1, "u1"),  # validated 0/1, then viewed as numpy bool
    _V.UINT64: ("<Q", 8, "<u8"),
    _V.INT64: ("<q", 8, "<i8"),
    _V.FLOAT64: ("<d", 8, "<f8"),
}
_VALUE_TYPES = {int(t): t for t in GGUFValueType}
_QTYPES = {int(t): t for t in GGMLQuantizationType}

# Smallest encodings, used to bound counts by the bytes that remain.
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset
_MIN_ARRAY_BYTES = 4 + 8  # elem type + count


@dataclass(frozen=True)
class TensorInfo:
    """One validated tensor-info record; sizes are Python ints."""

    name: str
    dims: tuple[int, ...]  # GGUF order, fastest-varying first
    qtype: GGMLQuantizationType
    offset: int  # relative to the data section
    n_elements: int
    n_bytes: int
    info_offset: int  # byte offset of the record in the file (for error messages)


@dataclass
class ParsedFile:
    """Everything read from one GGUF file, validated."""

    path: Path
    version: int
    file_size: int
    metadata: dict[str, Any]
    metadata_types: dict[str, Any]
    kv_offsets: dict[str, int]
    alignment: int
    data_offset: int  # absolute file offset of the tensor data section
    tensor_infos: list[TensorInfo]
    buffer: np.ndarray = field(repr=False)  # uint8 [file_size], read-only view of the mmap


class _Cursor:
    """Bounds-checked sequential reader over a bytes-like buffer."""

    __slots__ = ("path", "buf", "size", "pos")

    def __init__(self, path: Path, buf, size: int):
        self.path = path
        self.buf = buf
        self.size = size
        self.pos = 0

    def fail(self, fld: str, message: str, offset: int | None = None) -> GGUFError:
        return GGUFError(self.path, fld, message, self.pos if offset is None else offset)

    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, fld: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(fld, f"truncated: needs {n} bytes, {self.size - self.pos} remain")

    def unpack(self, fmt: str, n: int, fld: str):
        self.need(n, fld)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, fld: str) -> int:
        return self.unpack("<I", 4, fld)

    def u64(self, fld: str) -> int:
        return self.unpack("<Q", 8, fld)

    def string(self, fld: str) -> str:
        start = self.pos
        n = self.u64(fld + ".length")
        if n > self.size - self.pos:
            raise self.fail(fld, f"string length {n} exceeds the {self.size - self.pos} bytes that remain", start)
        try:
            s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8")  # mmap slices are bytes already
        except UnicodeDecodeError as e:
            raise self.fail(fld, f"invalid UTF-8 ({e.reason} at string byte {e.start})", start) from None
        self.pos += n
        return s


def _read_value(cur: _Cursor, vtype: GGUFValueType, fld: str, depth: int, arr_base: np.ndarray):
    """Reads one value of `vtype`; returns (value, type descriptor)."""
    spec = _SCALARS.get(vtype)
    if spec is not None:
        start = cur.pos
        v = cur.unpack(spec[0], spec[1], fld)
        if vtype == _V.BOOL:
            if v > 1:
                raise cur.fail(fld, f"bool value {v} is not 0 or 1", start)
            v = bool(v)
        return v, vtype
    if vtype == _V.STRING:
        return cur.string(fld), vtype
    if vtype == _V.ARRAY:
        return _read_array(cur, fld, depth + 1, arr_base)
    raise cur.fail(fld, f"unhandled value type {vtype!r}")  # pragma: no cover - table covers all


def _value_type(cur: _Cursor, fld: str) -> GGUFValueType:
    start = cur.pos
    raw = cur.u32(fld)
    t = _VALUE_TYPES.get(raw)
    if t is None:
        raise cur.fail(fld, f"unknown value type {raw}", start)
    return t


def _read_array(cur: _Cursor, fld: str, depth: int, arr_base: np.ndarray):
    start = cur.pos
    if depth > MAX_ARRAY_DEPTH:
        raise cur.fail(fld, f"arrays nested deeper than {MAX_ARRAY_DEPTH} levels", start)
    etype = _value_type(cur, fld + ".elem_type")
    count = cur.u64(fld + ".count")
    left = cur.remaining()
    spec = _SCALARS.get(etype)
    if spec is not None:
        n_bytes = count * spec[1]
        if n_bytes > left:
            raise cur.fail(fld, f"array of {count} {etype.name} needs {n_bytes} bytes, {left} remain", start)
        # Zero-copy, read-only (the mmap is read-only); a Python int offset keeps numpy from overflowing.
        arr = arr_base[cur.pos : cur.pos + n_bytes].view(spec[2])
        if etype == _V.BOOL:
            if count and int(arr.max()) > 1:
                raise cur.fail(fld, "bool array holds a value other than 0 or 1", start)
            arr = arr.view(np.bool_)
        cur.pos += n_bytes
        return arr, (_V.ARRAY, etype)
    if etype == _V.STRING:
        if count * 8 > left:
            raise cur.fail(fld, f"array of {count} strings needs at least {count * 8} bytes, {left} remain", start)
        return _read_str_array(cur, fld, count), (_V.ARRAY, etype)
    # array of arrays
    if count * _MIN_ARRAY_BYTES > left:
        raise cur.fail(fld, f"array of {count} arrays needs at least {count * _MIN_ARRAY_BYTES} bytes, {left} remain", start)
    if depth + 1 > MAX_ARRAY_DEPTH:
        raise cur.fail(fld, f"arrays nested deeper than {MAX_ARRAY_DEPTH} levels", start)
    items = []
    for i in range(count):
        v, _t = _read_array(cur, f"{fld}[{i}]", depth + 1, arr_base)
        items.append(v)
    return items, (_V.ARRAY, _V.ARRAY)


def _read_str_array(cur: _Cursor, fld: str, count: int) -> list[str]:
    """Hot path for vocabularies (262144 entries): one local loop, no per-item method calls."""
    buf, size, pos = cur.buf, cur.size, cur.pos
    unpack = struct.Struct("<Q").unpack_from
    out = [None] * count
    try:
        for i in range(count):
            if pos + 8 > size:
                raise GGUFError(cur.path, f"{fld}[{i}].length", "truncated: needs 8 bytes", pos)
            (n,) = unpack(buf, pos)
            pos += 8
            if n > size - pos:
                raise GGUFError(cur.path, f"{fld}[{i}]", f"string length {n} exceeds the {size - pos} bytes that remain", pos - 8)
            out[i] = buf[pos : pos + n].decode("utf-8")
            pos += n
    except UnicodeDecodeError as e:
        raise GGUFError(cur.path, f"{fld}[{i}]", f"invalid UTF-8 ({e.reason} at string byte {e.start})", pos - 8) from None
    cur.pos = pos
    return out


def parse_file(path: str | os.PathLike) -> ParsedFile:
    """Opens, maps and validates one GGUF file. Raises GGUFError for anything wrong."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                # mmap cannot map an empty file, and a header needs 24 bytes anyway.
                head = f.read(24)  # bounded: st_size is 0 for devices such as /dev/zero
                cur = _Cursor(path, head, len(head))
                _check_magic_version(cur)
                cur.u64("header.n_tensors")
                cur.u64("header.n_kv")
                raise cur.fail("header", "truncated")  # pragma: no cover - the reads above raise
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except GGUFError:
        raise
    except OSError as e:
        raise GGUFError(path, "file", f"cannot open: {e.strerror or e}") from None
    try:
        return _parse_mapped(path, mm, size)
    except GGUFError:
        raise
    except (MemoryError, OverflowError, ValueError, IndexError, KeyError, TypeError, RecursionError, struct.error) as e:
        # Defence in depth: every check above should have caught this first.
        raise GGUFError(path, "file", f"malformed ({type(e).__name__}: {e})") from None


def _check_magic_version(cur: _Cursor) -> int:
    cur.need(4, "header.magic")
    magic = bytes(cur.buf[0:4])
    if magic != MAGIC:
        raise cur.fail("header.magic", f"not a GGUF file (magic {magic!r}, expected {MAGIC!r})", 0)
    cur.pos = 4
    version = cur.u32("header.version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (big-endian file?)" if version & 0xFFFF == 0 and version else ""
        raise cur.fail("header.version", f"unsupported version {version}{hint}; supported: 2, 3", 4)
    return version


def _parse_mapped(path: Path, mm: mmap.mmap, size: int) -> ParsedFile:
    cur = _Cursor(path, mm, size)
    arr_base = np.frombuffer(mm, dtype=np.uint8)  # read-only: the mmap is ACCESS_READ
    version = _check_magic_version(cur)
    n_tensors = cur.u64("header.n_tensors")
    n_kv = cur.u64("header.n_kv")
    left = cur.remaining()
    if n_kv * _MIN_KV_BYTES > left:
        raise cur.fail("header.n_kv", f"{n_kv} key/value pairs cannot fit in the {left} bytes that remain", 16)
    if n_tensors * _MIN_TENSOR_INFO_BYTES > left - n_kv * _MIN_KV_BYTES:
        raise cur.fail("header.n_tensors", f"{n_tensors} tensor infos cannot fit in the {left} bytes that remain", 8)

    metadata: dict[str, Any] = {}
    types: dict[str, Any] = {}
    kv_offsets: dict[str, int] = {}
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"kv[{i}].key")
        if key in metadata:
            raise cur.fail(f"kv[{i}] '{key}'", f"duplicate key (first at byte {kv_offsets[key]})", start)
        vtype = _value_type(cur, f"kv '{key}'.type")
        value, tdesc = _read_value(cur, vtype, f"kv '{key}'", 0, arr_base)
        metadata[key] = value
        types[key] = tdesc
        kv_offsets[key] = start

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        off = kv_offsets["general.alignment"]
        if types["general.alignment"] != _V.UINT32:
            raise GGUFError(path, "general.alignment", f"stored as {_type_name(types['general.alignment'])}, expected UINT32", off)
        alignment = metadata["general.alignment"]
        if alignment == 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise GGUFError(path, "general.alignment", f"{alignment} is not a power of two <= {MAX_ALIGNMENT}", off)

    if n_tensors * _MIN_TENSOR_INFO_BYTES > cur.remaining():
        raise cur.fail("header.n_tensors", f"{n_tensors} tensor infos cannot fit in the {cur.remaining()} bytes that remain", 8)
    infos = [_read_tensor_info(cur, i) for i in range(n_tensors)]

    data_offset = -(-cur.pos // alignment) * alignment
    if infos and data_offset > size:
        raise GGUFError(path, "tensor data", f"truncated: data section would start at byte {data_offset}, file has {size}", cur.pos)
    _check_tensor_layout(path, infos, alignment, data_offset, size)
    return ParsedFile(
        path=path,
        version=version,
        file_size=size,
        metadata=metadata,
        metadata_types=types,
        kv_offsets=kv_offsets,
        alignment=alignment,
        data_offset=data_offset,
        tensor_infos=infos,
        buffer=arr_base,
    )


def _read_tensor_info(cur: _Cursor, i: int) -> TensorInfo:
    start = cur.pos
    name = cur.string(f"tensor_info[{i}].name")
    fld = f"tensor '{name}'"
    n_dims = cur.u32(fld + ".n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(fld + ".n_dims", f"{n_dims} dimensions; must be 1..{MAX_DIMS}", cur.pos - 4)
    cur.need(8 * n_dims, fld + ".dims")
    dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
    dims = tuple(int(d) for d in dims)
    if any(d == 0 for d in dims):
        raise cur.fail(fld + ".dims", f"dimension of 0 in {list(dims)}")
    cur.pos += 8 * n_dims
    raw_type = cur.u32(fld + ".type")
    qtype = _QTYPES.get(raw_type)
    if qtype is None:
        raise cur.fail(fld + ".type", f"tensor '{name}' has unknown tensor type {raw_type}", cur.pos - 4)
    tt = TYPE_TRAITS.get(qtype)
    if tt is None:
        supported = ", ".join(t.name for t in TYPE_TRAITS)
        raise cur.fail(fld + ".type", f"tensor '{name}' has unsupported type {qtype.name} (supported: {supported})", cur.pos - 4)
    offset = cur.u64(fld + ".offset")
    n_el = 1
    for d in dims:
        n_el *= d  # Python ints: no wrap past 2^64
    if dims[0] % tt.block_size:
        raise cur.fail(fld + ".dims", f"row length {dims[0]} is not a multiple of the {qtype.name} block size {tt.block_size}", start)
    n_bytes = n_el // tt.block_size * tt.type_size
    return TensorInfo(name, dims, qtype, offset, n_el, n_bytes, start)


def _check_tensor_layout(path: Path, infos: list[TensorInfo], alignment: int, data_offset: int, size: int) -> None:
    seen: dict[str, int] = {}
    data_size = size - data_offset
    for ti in infos:
        fld = f"tensor '{ti.name}'"
        if ti.name in seen:
            raise GGUFError(path, fld, f"duplicate tensor name (first at byte {seen[ti.name]})", ti.info_offset)
        seen[ti.name] = ti.info_offset
        if ti.offset % alignment:
            raise GGUFError(path, fld + ".offset", f"data offset {ti.offset} is not a multiple of the alignment {alignment}", ti.info_offset)
        if ti.offset > data_size or ti.n_bytes > data_size - ti.offset:
            raise GGUFError(
                path,
                fld + ".offset",
                f"data [{data_offset + ti.offset}, {data_offset + ti.offset + ti.n_bytes}) of shape {list(ti.dims)} "
                f"lies past the end of the file ({size} bytes)",
                ti.info_offset,
            )
    ordered = sorted((ti for ti in infos if ti.n_bytes), key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.n_bytes > b.offset:
            raise GGUFError(path, f"tensor '{b.name}'.offset", f"data overlaps tensor '{a.name}'", b.info_offset)


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return "ARRAY of " + t[1].name
    return t.name
