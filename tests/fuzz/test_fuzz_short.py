"""The short fuzz run of CI (docs/FUZZING.md): bounded, derandomized hypothesis runs of each target
(the long runs are bench/fuzz.py), plus a fixed test for each bug the long runs found."""

import json
import math
import struct

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from edged.models import ModelError
from tests.fuzz import mutators, targets
from tests.helpers.tiny_models import write_tiny_model

_SETTINGS = dict(derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def gguf_seeds(tmp_path_factory):
    seeds = mutators.write_seeds(tmp_path_factory.mktemp("fuzz-seeds"))
    for s in seeds:  # each seed loads cleanly (compiles the kernels of every architecture once)
        assert targets.load_path(s.data) > 0, s.name
    return seeds


@pytest.fixture(scope="module")
def bodies():
    seeds = mutators.request_seeds(targets.served_model())
    for route, bs in seeds.items():
        for b in bs:
            assert targets.request_body(route, json.dumps(b).encode()) == 200, (route, b)
    return seeds


@settings(max_examples=300, **_SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 63))
def test_load_path_mutants_raise_only_typed_errors(gguf_seeds, seed, which):
    """A structure-aware mutant of a tiny model loads (finite logits) or raises a typed error."""
    data = mutators.mutate_gguf(np.random.default_rng(seed), gguf_seeds[which % len(gguf_seeds)])
    try:
        targets.load_path(data)
    except targets.LOAD_ERRORS:
        pass


@settings(max_examples=60, **_SETTINGS)
@given(data=st.binary(max_size=512))
def test_load_path_arbitrary_bytes(data):
    """Unstructured bytes (with and without the magic) only ever give GGUFError."""
    for blob in (data, b"GGUF\x03\x00\x00\x00" + data):
        with pytest.raises(targets.LOAD_ERRORS):
            targets.load_path(blob)


@settings(max_examples=400, **_SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 255))
def test_request_bodies_get_no_5xx(bodies, seed, which):
    """A mutated body of any POST route is answered below 500 and nothing escapes the app."""
    routes = sorted(bodies)
    route = routes[which % len(routes)]
    rng = np.random.default_rng(seed)
    body = mutators.mutate_json(rng, bodies[route][rng.integers(len(bodies[route]))],
                                mutators.field_names(bodies))
    assert 200 <= targets.request_body(route, body) < 500


@settings(max_examples=100, **_SETTINGS)
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                         lambda c: st.lists(c, max_size=4) | st.dictionaries(
                             st.sampled_from(["model", "messages", "prompt", "input", "max_tokens", "stream",
                                              "role", "content", "tokens", "options", "n", "tools"]), c,
                             max_size=5), max_leaves=12),
       which=st.integers(0, 255))
def test_request_arbitrary_json_gets_no_5xx(bodies, body, which):
    """Any JSON value at all, to any POST route, is a 2xx-4xx."""
    routes = sorted(bodies)
    assert 200 <= targets.request_body(routes[which % len(routes)], json.dumps(body).encode()) < 500


# -- regressions: what the long runs found ----------------------------------------------------------

def _patched(tmp_path, arch, tensor, at, raw: bytes, *, ttype=None):
    """A tiny `arch` model with `raw` written at byte `at` of `tensor`'s data (or its type changed)."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == tensor)
    data = bytearray(path.read_bytes())
    if ttype is None:
        data[t.data_offset + at : t.data_offset + at + len(raw)] = raw
        return bytes(data)
    seed = mutators.parse_seed(path.name, bytes(data))
    f = next(f for f in seed.fields if f.kind == "ttype" and f.key == tensor)
    data[f.offset : f.offset + 4] = struct.pack("<I", ttype)
    return bytes(data)


@pytest.mark.parametrize("arch,tensor,at,raw,message", [
    ("gemma3", "blk.1.attn_norm.weight", 8, struct.pack("<f", math.nan), r"\(F32\) has NaN or infinite values"),
    ("phi3", "blk.0.ffn_norm.weight", 0, struct.pack("<f", -math.inf), r"\(F32\) has NaN or infinite values"),
    ("llama", "output.weight", 6, b"\x00\x7c", r"\(F16\) has NaN or infinite values"),
    ("qwen2", "token_embd.weight", 34, b"\x00\x7e", r"\(Q8_0\) has NaN or infinite block scales"),
    ("gemma3", "blk.0.ffn_down.weight", 208, b"\x00\xfc", r"\(Q6_K\) has NaN or infinite block scales"),
    ("llama", "blk.1.ffn_down.weight", 2, b"\x00\x7c", r"\(Q4_K\) has NaN or infinite block scales"),
    ("qwen3", "blk.0.attn_q.weight", 22, b"\x00\x7c", r"\(Q5_0\) has NaN or infinite block scales"),
    ("gemma3", "blk.1.attn_norm.weight", 0, struct.pack("<f", 3.4e38), r"holds 3\.4e\+38: norm weights"),
    ("qwen2", "blk.0.attn_k.bias", 4, struct.pack("<f", -2.0e6), r"holds 2e\+06: norm weights"),
])
def test_nonfinite_or_huge_weights_are_refused(tmp_path, arch, tensor, at, raw, message):
    """Such files loaded and gave NaN / inf logits (the long load run's only finding)."""
    with pytest.raises(ModelError, match=rf"tensor '{tensor}' {message}"):
        targets.load_path(_patched(tmp_path, arch, tensor, at, raw))


def test_a_norm_retyped_to_bf16_is_refused(tmp_path):
    """An F32 norm weight whose type field says BF16 read its float32 bytes as huge BF16 values."""
    data = _patched(tmp_path, "llama", "blk.1.attn_norm.weight", 0, b"", ttype=int(gguf.GGMLQuantizationType.BF16))
    with pytest.raises(ModelError, match=r"blk\.1\.attn_norm\.weight"):
        targets.load_path(data)


def test_the_reference_model_passes_the_weight_checks():
    """The checks refuse no real model: every tensor of Gemma 3 270M Q4_K_M passes."""
    from edged.models.tensors import VECTOR_LIMIT, as_f32_vector, check_finite
    from edged.quant import load_gguf
    from tests.helpers.model import default_model_path

    gf = load_gguf(default_model_path())
    for qt in gf.tensors.values():
        check_finite(qt, gf.path)
        if len(qt.shape) == 1:
            assert np.abs(as_f32_vector(qt)).max() < VECTOR_LIMIT / 100, qt.name


@pytest.mark.parametrize("length,loads", [(256, True), (257, False), (5000, False)])
def test_a_very_long_special_token_is_a_tokenizer_error(tmp_path, length, loads):
    """A 5000-character control token made the special-token regex builder recurse past Python's
    limit (an untyped RecursionError); now at most 256 characters, far above real ones (Gemma 3: 31)."""
    from edged.quant import load_gguf
    from edged.tokenizer import TokenizerError

    tokens = load_gguf(write_tiny_model(tmp_path / "base.gguf", "gemma3")).get_str_list("tokenizer.ggml.tokens")
    tokens[0] = "a" * length  # <pad>, a CONTROL token
    path = write_tiny_model(tmp_path / "m.gguf", "gemma3",
                            extra_kv={"tokenizer.ggml.tokens": (tokens, gguf.GGUFValueType.ARRAY)})
    if loads:
        assert targets.load_path(path.read_bytes()) == 300
    else:
        with pytest.raises(TokenizerError, match=rf"tokenizer\.ggml\.tokens\[0\] is a special token of "
                                                 rf"{length} characters; at most 256 are supported"):
            targets.load_path(path.read_bytes())
