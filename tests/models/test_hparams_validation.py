"""Hyper-parameters are validated at load (issue 18): every bad value of every checked key of every
architecture is a ModelError naming the file, the key and the value, never NaN logits or a bare
arithmetic error; special token ids outside the vocabulary are refused; the good tiny models (and
edge values that are valid) still load and give finite logits."""

import math

import gguf
import numpy as np
import pytest

import tests.helpers.numpy_ops as numpy_ops
from edged.backends.base import Batch
from edged.loader import load
from edged.models import ModelError, load_model
from edged.quant import load_gguf
from edged.tokenizer import TokenizerError
from tests.helpers.tiny_models import ARCHS, default_spec, write_tiny_model

V = gguf.GGUFValueType
NAN, INF = float("nan"), float("inf")
U64_MAX = 2**64 - 1
# bad integers with a GGUF type that can hold them
BAD_COUNTS = [(0, V.UINT32), (-1, V.INT32), (2**31, V.UINT32), (U64_MAX, V.UINT64)]


def _f32(*values):
    return [(v, V.FLOAT32) for v in values]


def _cases():
    """(arch, {suffix: (value, type)}, suffix the message must name)."""
    out = []
    for arch in ARCHS:
        spec = default_spec(arch)

        def add(suffix, values, named=None, also=None):
            for v in values:
                out.append((arch, {suffix: v, **(also or {})}, named or suffix))

        for suffix in ("embedding_length", "attention.head_count", "block_count", "feed_forward_length",
                       "context_length"):
            add(suffix, BAD_COUNTS)
        add("block_count", [(1, V.UINT32), (spec.n_layers + 1, V.UINT32)])  # not the file's blocks
        add("attention.head_count_kv", BAD_COUNTS + [(3, V.UINT32), (8, V.UINT32)])  # 3, 8: not dividing 4
        add("attention.key_length", BAD_COUNTS + [(15, V.UINT32)])  # odd
        add("attention.value_length", BAD_COUNTS + [(spec.head_dim + 2, V.UINT32)])  # != key_length
        add("rope.dimension_count", BAD_COUNTS + [(7, V.UINT32), (1000, V.UINT32)])  # odd, > head dim
        add("vocab_size", BAD_COUNTS + [(spec.vocab - 1, V.UINT32)])  # != token_embd rows
        add("attention.sliding_window", BAD_COUNTS[1:])  # 0 means no window
        if not spec.write_key_length:  # head dim = n_embd / n_heads must be whole
            add("embedding_length", [(spec.n_embd + 2, V.UINT32)])
        add("attention.layer_norm_rms_epsilon",
            _f32(0.0, -1.0, NAN, INF, 1.0) + [(1e-50, V.FLOAT64), (U64_MAX, V.UINT64)])  # 1e-50: 0 in float32
        add("rope.freq_base", _f32(0.0, -1.0, NAN, INF, -INF, 1e-38) + [(1e39, V.FLOAT64)])  # 1e-38: angles overflow
        add("rope.scaling.factor", _f32(-1.0, NAN, INF))
        add("rope.scaling.factor", [(1e-40, V.FLOAT64)], also={"rope.scaling.type": ("linear", V.STRING)})
        add("rope.scale_linear", _f32(-1.0, NAN, INF))
    out += [("gemma3", {"attention.sliding_window": (257, V.UINT32)}, "attention.sliding_window")]  # > context
    out += [("gemma3", {"final_logit_softcapping": v}, "final_logit_softcapping")
            for v in _f32(0.0, -1.0, NAN, INF) + [(1e39, V.FLOAT64)]]
    out += [("gemma2", {"attention.sliding_window": (257, V.UINT32)}, "attention.sliding_window")]
    out += [("gemma2", {key: v}, key) for key in ("attn_logit_softcapping", "final_logit_softcapping")
            for v in _f32(0.0, -1.0, NAN, INF, 1e-40) + [(1e39, V.FLOAT64)]]  # 1e-40: 1/cap is inf in float32
    return out


CASES = _cases()


def _id(case):
    arch, kv, named = case
    return f"{arch}-{named}-{kv[named][0]!r}"


def _written(tmp_path, arch, kv: dict, **options):
    extra = {f"{arch}.{k}" if not k.startswith("tokenizer.") else k: v for k, v in kv.items()}
    return write_tiny_model(tmp_path / "m.gguf", arch, extra_kv=extra, **options)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bad_hparam_is_a_model_error_naming_key_and_value(tmp_path, case):
    arch, kv, named = case
    path = _written(tmp_path, arch, kv)
    with pytest.raises(ModelError) as e:
        load_model(load_gguf(path), numpy_ops)
    msg = str(e.value)
    assert msg.startswith(f"{path}: "), msg
    assert f"{arch}.{named}" in msg, msg
    if "overflow" not in msg:  # the RoPE angle check names the keys, then the values it used
        value = kv[named][0]
        shown = "nan" if isinstance(value, float) and math.isnan(value) else None
        assert f"{arch}.{named} = " in msg and (shown is None or shown in msg), msg


def test_table_covers_every_architecture_and_value_kind():
    archs = {c[0] for c in CASES}
    values = {repr(v[0]) for c in CASES for v in c[1].values()}
    assert archs == set(ARCHS)
    assert {"0", "-1", "2147483648", str(U64_MAX), "nan", "inf"} <= values


@pytest.mark.parametrize("value", [NAN, 0.0, -1.0])
def test_bad_rope_freqs_tensor(tmp_path, value):
    path = write_tiny_model(tmp_path / "m.gguf", "llama", rope_freqs=True)
    reader = gguf.GGUFReader(path, "r+")  # poke one divisor in place
    next(t for t in reader.tensors if t.name == "rope_freqs.weight").data[3] = value
    del reader
    msg = r"\(F32\) has NaN or infinite values \(the first at \[3\]" if value != value else r"\[3\] = .*: must be finite and > 0"
    with pytest.raises(ModelError, match=r"tensor 'rope_freqs\.weight' ?" + msg):  # NaN: tensors.check_finite
        load_model(load_gguf(path), numpy_ops)


def _logits(model) -> np.ndarray:
    kv = model.allocate_kv(4, 16)
    return model.forward(Batch.single(np.arange(5, 25), 0, 4, 16), kv)


@pytest.mark.parametrize("arch", ARCHS)
def test_good_tiny_models_load_with_finite_logits(tmp_path, arch):
    logits = _logits(load_model(load_gguf(write_tiny_model(tmp_path / "m.gguf", arch)), numpy_ops))
    assert logits.shape == (1, 300) and np.isfinite(logits).all()


@pytest.mark.parametrize("arch,kv", [
    ("llama", {"rope.scaling.factor": (0.0, V.FLOAT32)}),  # 0: not set, as llama.cpp reads it
    ("llama", {"rope.freq_base": (U64_MAX, V.UINT64)}),  # huge but finite: slow frequencies only
    ("qwen2", {"attention.layer_norm_rms_epsilon": (1e-30, V.FLOAT32)}),
    ("gemma3", {"attention.sliding_window": (0, V.UINT32)}),  # no window
    ("gemma3", {"attention.sliding_window": (256, V.UINT32), "final_logit_softcapping": (30.0, V.FLOAT32)}),
    ("gemma2", {"attn_logit_softcapping": (1e-37, V.FLOAT32), "final_logit_softcapping": (1e38, V.FLOAT32)}),
    ("phi3", {"attention.sliding_window": (2047, V.UINT32)}),  # > context: phi3 ignores it (llama.cpp)
])
def test_valid_edge_values_load_with_finite_logits(tmp_path, arch, kv):
    assert np.isfinite(_logits(load_model(load_gguf(_written(tmp_path, arch, kv)), numpy_ops))).all()


@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id", "eot_token_id", "seperator_token_id",
                                 "unknown_token_id"])
@pytest.mark.parametrize("value", [(-1, V.INT32), (300, V.UINT32), (U64_MAX, V.UINT64)])
def test_special_token_id_outside_vocabulary(tmp_path, arch, key, value):
    path = _written(tmp_path, arch, {f"tokenizer.ggml.{key}": value})
    with pytest.raises(TokenizerError, match=rf"tokenizer\.ggml\.{key} = {value[0]} is outside the vocabulary"):
        load(str(path), warmup=False, quiet=True)


def test_more_tokens_than_embedding_rows(tmp_path):
    """A tokenizer whose last ids have no embedding row is refused (padded embeddings are fine)."""
    gf = load_gguf(write_tiny_model(tmp_path / "base.gguf", "gemma3"))
    tokens = gf.get_str_list("tokenizer.ggml.tokens") + ["▁extra1", "▁extra2"]
    longer = {"tokenizer.ggml.tokens": (tokens, V.ARRAY),
              "tokenizer.ggml.scores": ([-1.0] * len(tokens), V.ARRAY),
              "tokenizer.ggml.token_type": ([1] * len(tokens), V.ARRAY)}
    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", extra_kv=longer)
    with pytest.raises(ModelError, match=r"tokenizer\.ggml\.tokens has 302 tokens but token_embd\.weight "
                                         r"has 300 rows: token ids 300\.\.301 have no embedding"):
        load(str(path), warmup=False, quiet=True)


def test_loader_turns_an_escaped_arithmetic_error_into_a_model_error(tmp_path, monkeypatch):
    """The fuzzer's ZeroDivisionError escaped untyped; the loader's last guard names the file."""
    import edged.loader

    path = write_tiny_model(tmp_path / "m.gguf", "llama")

    def broken(gf):
        raise ZeroDivisionError("0.0 cannot be raised to a negative power")

    monkeypatch.setattr(edged.loader, "load_model", broken)
    with pytest.raises(ModelError, match=rf"^{path}: the model cannot be built from this file "
                                         r"\(ZeroDivisionError: 0\.0 cannot be raised"):
        load(str(path), warmup=False, quiet=True)

    def named(gf):
        raise TokenizerError("tokenizer.ggml.x = 1: bad")

    monkeypatch.setattr(edged.loader, "load_model", named)
    with pytest.raises(TokenizerError, match=r"^tokenizer\.ggml\.x = 1: bad$"):  # already named: unchanged
        load(str(path), warmup=False, quiet=True)
