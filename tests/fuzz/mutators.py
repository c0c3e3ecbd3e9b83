"""Structure-aware mutators: GGUF files (tiny models of every architecture) and JSON request bodies.

A GGUF seed is parsed once into its fields (every KV value, string and array length, value type,
tensor dim / type / offset, tensor data span); a mutant overwrites 1-3 fields with boundary values
(0, -1, 2^31, 2^64-1, NaN, +-inf, ...) and may end with one splice (a string replaced, a KV added
or dropped, bytes inserted, a cut), re-padding the data section to its alignment.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.helpers.tiny_models import ARCHS, write_tiny_model

# GGUF value types: struct format (None: string / array)
_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 8: None, 9: None,
        10: "<Q", 11: "<q", 12: "<d"}
_INT_EXTREMES = (0, 1, 2, 3, 7, -1, -2, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                 2**53, 2**63 - 1, 2**63, 2**64 - 1)
_FLOAT_EXTREMES = (0.0, -0.0, 1.0, -1.0, 1e-45, 1e-30, 1e30, 3.4e38, 2.0**31, 2.0**64, math.nan,
                   math.inf, -math.inf)
_LEN_EXTREMES = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1)
_STRINGS = ("", "x", "llama", "gemma3", "qwen2", "phi3", "gpt2", "bert", "<s>", "</s>", "\u2581",
            "\x00", "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"), "a" * 5000,
            "{{", "{% if %}", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
            "{% for i in range(10**9) %}x{% endfor %}", "{{ 'a' * 10**9 }}", "{{ raise_exception('no') }}",
            "{{ messages[0].__class__.__mro__ }}", "{% set x = namespace() %}{{ x }}", "{{ 1/0 }}",
            "{{ messages | tojson }}", "{%- for m in messages %}{{ m['role'] }}{% endfor %}<|im_start|>")
# keys a converter may write; added with boundary values (hparams the tiny files leave out included)
_ADD_KEYS = ("{a}.context_length", "{a}.attention.sliding_window", "{a}.rope.scaling.factor",
             "{a}.rope.scaling.type", "{a}.attention.key_length", "{a}.attention.value_length",
             "{a}.rope.dimension_count", "{a}.vocab_size", "{a}.final_logit_softcapping",
             "{a}.attn_logit_softcapping", "{a}.rope.freq_base_swa", "{a}.attention.layer_norm_epsilon",
             "{a}.rope.scaling.original_context_length", "{a}.expert_count", "general.alignment",
             "tokenizer.chat_template", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.sep_token_id",
             "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.pre",
             "tokenizer.chat_template.tool_use", "tokenizer.ggml.merges", "tokenizer.ggml.scores")


@dataclass
class Field:
    offset: int
    fmt: str  # struct format of the bytes at offset
    kind: str  # "value" | "len" | "type" | "dim" | "ndims" | "ttype" | "toffset" | "count"
    key: str = ""


@dataclass
class GGUFSeed:
    """A valid file and the positions of its fields."""

    name: str
    data: bytes
    fields: list = field(default_factory=list)
    strings: list = field(default_factory=list)  # (start, end, key): a string's length + bytes
    kvs: list = field(default_factory=list)  # (start, end, key) of each KV entry
    tensors: list = field(default_factory=list)  # (data offset, nbytes, ggml type)
    header_end: int = 0
    data_start: int = 0
    alignment: int = 32


def parse_seed(name: str, data: bytes) -> GGUFSeed:
    """Walk a valid GGUF v3 file, recording where each field is (the seed must be well formed)."""
    s = GGUFSeed(name, data)
    pos = 8
    s.fields.append(Field(pos, "<Q", "count", "n_tensors"))
    s.fields.append(Field(pos + 8, "<Q", "count", "n_kv"))
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16

    def string(p, key):
        n = struct.unpack_from("<Q", data, p)[0]
        s.fields.append(Field(p, "<Q", "len", key))
        s.strings.append((p, p + 8 + n, key))
        return p + 8 + n, data[p + 8 : p + 8 + n].decode("utf-8")

    def value(p, vtype, key, top):
        if vtype == 8:
            return string(p, key)[0]
        if vtype == 9:
            etype, count = struct.unpack_from("<IQ", data, p)
            s.fields.append(Field(p, "<I", "type", key))
            s.fields.append(Field(p + 4, "<Q", "len", key))
            p += 12
            for _ in range(count):
                p = value(p, etype, key, False)
            return p
        fmt = _FMT[vtype]
        s.fields.append(Field(p, fmt, "value", key))
        return p + struct.calcsize(fmt)

    for _ in range(n_kv):
        start = pos
        pos, key = string(pos, "key")
        vtype = struct.unpack_from("<I", data, pos)[0]
        s.fields.append(Field(pos, "<I", "type", key))
        pos = value(pos + 4, vtype, key, True)
        s.kvs.append((start, pos, key))
        if key == "general.alignment":
            s.alignment = struct.unpack_from("<I", data, pos - 4)[0]
    infos = []
    for _ in range(n_tensors):
        pos, tname = string(pos, "tensor")
        nd = struct.unpack_from("<I", data, pos)[0]
        s.fields.append(Field(pos, "<I", "ndims", tname))
        pos += 4
        for d in range(nd):
            s.fields.append(Field(pos + 8 * d, "<Q", "dim", tname))
        pos += 8 * nd
        s.fields.append(Field(pos, "<I", "ttype", tname))
        s.fields.append(Field(pos + 4, "<Q", "toffset", tname))
        ttype, toff = struct.unpack_from("<IQ", data, pos)
        infos.append((toff, ttype))
        pos += 12
    s.header_end = pos
    s.data_start = -(-pos // s.alignment) * s.alignment
    ends = sorted(o for o, _ in infos)[1:] + [len(data) - s.data_start]
    by_off = sorted(infos)
    s.tensors = [(o, e - o, t) for (o, t), e in zip(by_off, ends)]
    return s


def write_seeds(dirpath) -> list[GGUFSeed]:
    """A tiny random model of every architecture (gemma3 twice: with and without a sliding window),
    written to `dirpath` and parsed."""
    out = []
    variants = [(a, {}) for a in ARCHS] + [("gemma3", dict(sliding_window=0, n_layers=2)),
                                             ("llama", dict(rope_freqs=True, rope_scaling="linear"))]
    for i, (arch, kw) in enumerate(variants):
        p = write_tiny_model(Path(dirpath) / f"seed-{i}-{arch}.gguf", arch, seed=i, **kw)
        out.append(parse_seed(p.name, p.read_bytes()))
    return out


# -- GGUF mutations ------------------------------------------------------------------------------

def _pack(fmt: str, v) -> bytes:
    if fmt in ("<f", "<d"):
        return struct.pack(fmt, float(v)) if fmt == "<d" or not math.isfinite(v) or abs(v) < 3.5e38 \
            else struct.pack(fmt, math.inf)
    size = struct.calcsize(fmt)
    return int(v % (1 << (8 * size))).to_bytes(size, "little")  # two's complement wrap


def _boundary(rng, f: Field, old: bytes):
    if f.fmt in ("<f", "<d"):
        return _FLOAT_EXTREMES[rng.integers(len(_FLOAT_EXTREMES))]
    cur = int.from_bytes(old, "little")
    if f.kind == "len":
        choices = _LEN_EXTREMES + (cur - 1, cur + 1, cur * 2)
    elif f.kind == "type":
        choices = tuple(range(14)) + (2**32 - 1,)
    elif f.kind == "ttype":
        choices = (0, 1, 2, 3, 6, 8, 10, 12, 14, 15, 30, 31, 39, 2**31, 2**32 - 1)
    else:
        choices = _INT_EXTREMES + (cur - 1, cur + 1, cur * 2, cur // 2)
    return choices[rng.integers(len(choices))]


def _field_mutation(rng, seed: GGUFSeed, buf: bytearray) -> None:
    f = seed.fields[rng.integers(len(seed.fields))]
    if rng.random() < 0.5:  # favour the hyper-parameters and the tensor infos over the 300-entry arrays
        hot = [g for g in seed.fields if g.key not in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                                       "tokenizer.ggml.token_type", "tokenizer.ggml.merges")]
        f = hot[rng.integers(len(hot))]
    size = struct.calcsize(f.fmt)
    buf[f.offset : f.offset + size] = _pack(f.fmt, _boundary(rng, f, bytes(buf[f.offset : f.offset + size])))


def _tensor_data_mutation(rng, seed: GGUFSeed, buf: bytearray) -> None:
    """A NaN / inf / huge value (f32 or f16 pattern) or random bytes inside a tensor's data."""
    off, n, _ = seed.tensors[rng.integers(len(seed.tensors))]
    pos = seed.data_start + off + 2 * int(rng.integers(max(1, n // 2 - 2)))
    pat = [b"\x00\x7e", b"\x00\x7c", b"\x00\xfc", b"\xff\x7b", bytes(rng.integers(0, 256, 2, dtype=np.uint8))]
    p = pat[rng.integers(len(pat))]
    if rng.random() < 0.3:
        p = struct.pack("<f", _FLOAT_EXTREMES[rng.integers(len(_FLOAT_EXTREMES))])
    buf[pos : pos + len(p)] = p


def _bit_flips(rng, seed: GGUFSeed, buf: bytearray) -> None:
    end = seed.header_end if rng.random() < 0.8 else len(buf)
    for _ in range(rng.integers(1, 5)):
        p = int(rng.integers(end))
        buf[p] ^= 1 << int(rng.integers(8))


def _repad(seed: GGUFSeed, header: bytes) -> bytes:
    """The data section after a header whose length changed, at the file's alignment again."""
    start = -(-len(header) // seed.alignment) * seed.alignment
    return header + b"\x00" * (start - len(header)) + seed.data[seed.data_start :]


def _gstr(s: str) -> bytes:
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _splice(rng, seed: GGUFSeed, buf: bytearray) -> bytes:
    """One length-changing edit of the header (or a cut / insertion anywhere)."""
    kind = rng.integers(5)
    head = bytes(buf[: seed.header_end])
    if kind == 0:  # a string value replaced
        a, b, key = seed.strings[rng.integers(len(seed.strings))]
        return _repad(seed, head[:a] + _gstr(_STRINGS[rng.integers(len(_STRINGS))]) + head[b:])
    if kind == 1:  # a KV added (boundary value of a fitting type), n_kv + 1
        arch = seed.name.split("-")[-1].split(".")[0]  # seed-<i>-<arch>.gguf
        key = _ADD_KEYS[rng.integers(len(_ADD_KEYS))].format(a=arch)
        if "chat_template" in key or key.endswith((".pre", ".type")):
            val = struct.pack("<I", 8) + _gstr(_STRINGS[rng.integers(len(_STRINGS))])
        elif key.endswith(("merges", "scores")):
            val = struct.pack("<IIQ", 9, 6, 1) + struct.pack("<f", math.nan)
        else:
            vt = (4, 5, 6, 10, 12, 7)[rng.integers(6)]
            pool = _FLOAT_EXTREMES if vt in (6, 12) else _INT_EXTREMES
            val = struct.pack("<I", vt) + _pack(_FMT[vt], pool[rng.integers(len(pool))])
        at = seed.kvs[-1][1]
        n_kv = (struct.unpack_from("<Q", head, 16)[0] + 1) % 2**64  # the count may be mutated already
        head = head[:16] + struct.pack("<Q", n_kv) + head[24:at] + _gstr(key) + val + head[at:]
        return _repad(seed, head)
    if kind == 2:  # a KV dropped, n_kv - 1
        a, b, _ = seed.kvs[rng.integers(len(seed.kvs))]
        n_kv = (struct.unpack_from("<Q", head, 16)[0] - 1) % 2**64
        return _repad(seed, head[:16] + struct.pack("<Q", n_kv) + head[24:a] + head[b:])
    if kind == 3:  # random bytes inserted
        p = int(rng.integers(len(buf) if rng.random() < 0.2 else seed.header_end))
        return bytes(buf[:p]) + rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes() + bytes(buf[p:])
    return bytes(buf[: int(rng.integers(len(buf)))])  # a cut


def mutate_gguf(rng, seed: GGUFSeed) -> bytes:
    """1-3 in-place field edits, then (half of the time) one splice."""
    buf = bytearray(seed.data)
    for _ in range(rng.integers(1, 4)):
        r = rng.random()
        if r < 0.7:
            _field_mutation(rng, seed, buf)
        elif r < 0.85:
            _tensor_data_mutation(rng, seed, buf)
        else:
            _bit_flips(rng, seed, buf)
    return _splice(rng, seed, buf) if rng.random() < 0.5 else bytes(buf)


# -- JSON bodies ---------------------------------------------------------------------------------

_MSG = [{"role": "user", "content": "hi"}]


def request_seeds(model: str) -> dict:
    """route -> valid bodies (each route's documented fields, in small sizes)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                            "properties": {"x": {"type": "integer"}}}}}]
    return {
        "/v1/chat/completions": [
            {"model": model, "messages": _MSG, "max_tokens": 3},
            {"messages": [{"role": "system", "content": "s"}, *_MSG], "max_tokens": 2, "stream": True,
             "stream_options": {"include_usage": True}, "temperature": 0.7, "top_p": 0.9, "top_k": 5,
             "seed": 1, "stop": ["x"], "logprobs": True, "top_logprobs": 2, "n": 2},
            {"messages": _MSG, "max_tokens": 2, "tools": tools, "tool_choice": "auto",
             "logit_bias": {"5": 1.5}, "presence_penalty": 0.5},
            {"messages": _MSG, "max_tokens": 2, "response_format": {"type": "json_object"}},
            {"messages": _MSG, "max_tokens": 2, "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}},
        ],
        "/v1/completions": [
            {"model": model, "prompt": "hi", "max_tokens": 3},
            {"prompt": [[5, 6, 7], [8]], "max_tokens": 2, "echo": True, "logprobs": 2, "stream": True},
            {"prompt": [5, 6], "max_tokens": 0, "echo": True, "logprobs": 1, "prompt_logprobs": 1,
             "repetition_penalty": 1.1, "min_p": 0.1, "frequency_penalty": 0.2},
        ],
        "/v1/embeddings": [{"model": model, "input": "a cat"}, {"input": [[5, 6], [7]],
                                                                "encoding_format": "base64", "dimensions": 8}],
        "/v1/responses": [
            {"model": model, "input": "hi", "max_output_tokens": 3},
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
             "instructions": "be brief", "max_output_tokens": 2, "stream": True, "store": False,
             "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
        ],
        "/tokenize": [{"content": "a cat", "add_special": True}],
        "/detokenize": [{"tokens": [5, 6, 7]}],
        "/api/chat": [{"model": model, "messages": _MSG, "stream": False, "options": {"num_predict": 3}},
                      {"model": model, "messages": _MSG, "options": {"num_predict": 2, "temperature": 0.5,
                                                                      "stop": ["x"], "seed": 3}, "format": "json"}],
        "/api/generate": [{"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 3}},
                          {"model": model, "prompt": "hi", "raw": True, "context": [5, 6],
                           "options": {"num_predict": 2, "top_k": 3}}],
        "/api/show": [{"model": model}],
        "/api/pull": [{"model": "nonexistent-model", "stream": False}],
        "/v1/messages": [
            {"model": model, "max_tokens": 3, "messages": _MSG},
            {"model": model, "max_tokens": 2, "system": "s", "stream": True, "stop_sequences": ["x"],
             "messages": [*_MSG, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
             "tools": [{"name": "f", "input_schema": {"type": "object"}}], "temperature": 0.5},
        ],
        "/v1/messages/count_tokens": [{"model": model, "messages": _MSG}],
    }


_JSON_VALUES = (None, True, False, 0, -1, 1, 2, 255, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 0.5, -0.0,
                1e308, 1e-320, "", "x", "hi", "\u0000", "\ud800", "a" * 3000, "user", "assistant", "system",
                "tool", "text", "function", "json_object", [], [1], [[]], ["x"], {}, {"type": "text"},
                {"role": "user"}, [{"role": "user", "content": "x"}])
_NONFINITE = (b"NaN", b"Infinity", b"-Infinity", b"1e999")


def _paths(v, path=()):
    yield path, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, path + (i,))


def _set(root, path, value):
    if not path:
        return value
    cur = root
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return root


def mutate_json(rng, seed, names: list[str]) -> bytes:
    """1-3 edits of a copy of `seed` (a value replaced, a key dropped or added, a list grown, a value
    wrapped) then, a fifth of the time, a byte-level edit of the JSON text."""
    body = json.loads(json.dumps(seed))
    for _ in range(rng.integers(1, 4)):
        paths = list(_paths(body))
        path, v = paths[rng.integers(len(paths))]
        r = rng.random()
        if r < 0.45:
            body = _set(body, path, json.loads(json.dumps(_JSON_VALUES[rng.integers(len(_JSON_VALUES))])))
        elif r < 0.6 and path:
            parent = body
            for p in path[:-1]:
                parent = parent[p]
            del parent[path[-1]]
        elif r < 0.75 and isinstance(v, dict):
            v[names[rng.integers(len(names))]] = json.loads(json.dumps(_JSON_VALUES[rng.integers(len(_JSON_VALUES))]))
        elif r < 0.85 and isinstance(v, list) and v:
            v.extend([v[0]] * int(rng.choice([1, 3, 30, 300])))
        else:
            body = _set(body, path, [v] if rng.random() < 0.5 else {"x": v})
    text = json.dumps(body, ensure_ascii=bool(rng.random() < 0.5)).encode("utf-8", "surrogatepass")
    if rng.random() < 0.2:
        p = int(rng.integers(len(text) + 1))
        k = rng.integers(4)
        if k == 0:
            text = text[:p]
        elif k == 1:
            text = text[:p] + _NONFINITE[rng.integers(len(_NONFINITE))] + text[p:]
        elif k == 2 and text:
            b = bytearray(text)
            b[min(p, len(b) - 1)] = int(rng.integers(256))
            text = bytes(b)
        else:
            text = text[:p] + bytes(rng.integers(0, 256, 3, dtype=np.uint8)) + text[p:]
    return text


def field_names(seeds: dict) -> list[str]:
    """Every key the seeds use, plus a few they do not (added with boundary values)."""
    names = {k for bodies in seeds.values() for b in bodies for path, _ in _paths(b) for k in path
             if isinstance(k, str)}
    return sorted(names | {"max_completion_tokens", "suffix", "best_of", "user", "metadata",
                           "parallel_tool_calls", "keep_alive", "think", "thinking", "tool_choice",
                           "prompt_logprobs", "dimensions", "images", "template", "previous_response_id"})
