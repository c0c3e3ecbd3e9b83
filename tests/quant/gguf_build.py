"""Byte-level GGUF builder for loader tests: writes valid files and, on purpose, invalid ones
(gguf.GGUFWriter refuses to write most of the broken layouts the bad-file corpus needs)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

_FMT = {
    V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
    V.FLOAT32: "<f", V.BOOL: "<B", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d",
}


def gstr(s: str | bytes) -> bytes:
    """A GGUF string: u64 length + bytes (bytes pass through unchecked, e.g. invalid UTF-8)."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gvalue(vtype: V, value, elem_type: V | None = None) -> bytes:
    """Encodes a value (without its type tag). Arrays: value is a list, elem_type its element type."""
    if vtype == V.STRING:
        return gstr(value)
    if vtype == V.ARRAY:
        assert elem_type is not None
        out = struct.pack("<IQ", int(elem_type), len(value))
        for v in value:
            if elem_type == V.ARRAY:
                inner_type, inner = v  # nested: (elem type, list)
                out += gvalue(V.ARRAY, inner, inner_type)
            else:
                out += gvalue(elem_type, v)
        return out
    return struct.pack(_FMT[vtype], value)


def gkv(key: str | bytes, vtype: V | int, value=None, elem_type: V | None = None, raw: bytes | None = None) -> bytes:
    """One key/value record; `raw` replaces the encoded value (for crafted payloads)."""
    body = raw if raw is not None else gvalue(V(vtype), value, elem_type)
    return gstr(key) + struct.pack("<I", int(vtype)) + body


def gtensor_info(name: str | bytes, dims, qtype: int, offset: int) -> bytes:
    """One tensor-info record; dims in GGUF order (fastest first)."""
    return gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", int(qtype), offset)


@dataclass
class Built:
    """Bytes of a file plus the offsets where its sections start (for truncation tests)."""

    data: bytes
    boundaries: dict[str, int] = field(default_factory=dict)


def build(
    kvs: list[bytes],
    tinfos: list[bytes],
    tensor_data: list[bytes],
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
    magic: bytes = b"GGUF",
    offsets: list[int] | None = None,
) -> Built:
    """Assembles a file: header, KV records, tensor infos, padding, tensor data placed at `offsets`
    (default: packed in order with each start aligned; no padding after the last tensor)."""
    b = Built(b"")
    out = bytearray(magic + struct.pack("<IQQ", version, len(tinfos) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv))
    b.boundaries["header.version"] = 4
    b.boundaries["header.n_tensors"] = 8
    b.boundaries["header.n_kv"] = 16
    for i, kv in enumerate(kvs):
        b.boundaries[f"kv[{i}]"] = len(out)
        out += kv
    for i, ti in enumerate(tinfos):
        b.boundaries[f"tensor_info[{i}]"] = len(out)
        out += ti
    b.boundaries["padding"] = len(out)
    data_start = -(-len(out) // alignment) * alignment
    out += bytes(data_start - len(out))
    if offsets is None:
        offsets, pos = [], 0
        for d in tensor_data:
            pos = -(-pos // alignment) * alignment
            offsets.append(pos)
            pos += len(d)
    for i, (off, d) in enumerate(zip(offsets, tensor_data)):
        start = data_start + off
        if len(out) < start:
            out += bytes(start - len(out))
        b.boundaries[f"tensor_data[{i}]"] = start
        out[start : start + len(d)] = d
    b.data = bytes(out)
    return b


def packed_offsets(sizes: list[int], alignment: int = 32) -> list[int]:
    """Offsets a writer gives tensors of these byte sizes (each start aligned)."""
    offs, pos = [], 0
    for n in sizes:
        pos = -(-pos // alignment) * alignment
        offs.append(pos)
        pos += n
    return offs


def small_model(extra_kvs: list[bytes] | None = None, alignment: int | None = None) -> Built:
    """A small valid file: several value types and three tensors (F32, Q8_0, Q4_K). The last
    tensor ends the file, so cutting any byte off makes it invalid."""
    rng = np.random.default_rng(0)
    kvs = [
        gkv("general.architecture", V.STRING, "llama"),
        gkv("general.name", V.STRING, "tiny"),
        gkv("llama.context_length", V.UINT32, 128),
        gkv("llama.rope.freq_base", V.FLOAT32, 10000.0),
        gkv("tokenizer.ggml.tokens", V.ARRAY, ["<s>", "a", "héllo"], V.STRING),
        gkv("tokenizer.ggml.scores", V.ARRAY, [0.0, -1.0, -2.5], V.FLOAT32),
        gkv("x.flag", V.BOOL, True),
    ] + (extra_kvs or [])
    if alignment is not None:
        kvs.append(gkv("general.alignment", V.UINT32, alignment))
    align = alignment or 32
    shapes = [("a.f32", (8, 2), T.F32, 64), ("b.q8_0", (32, 2), T.Q8_0, 68), ("c.q4_k", (256,), T.Q4_K, 144)]
    datas = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for *_, n in shapes]
    offs = packed_offsets([len(d) for d in datas], align)
    tinfos = [gtensor_info(name, dims, qt, off) for (name, dims, qt, _), off in zip(shapes, offs)]
    return build(kvs, tinfos, datas, alignment=align)
