"""Tiny models of every architecture against the float64 reference forward: prefill, paged decode
and mixed batches on each backend (tests/models/tiny_checks.py), plus what each variant loaded.

Variants: Gemma 3 (6 layers: 5 sliding-window + 1 global, and without a window); Gemma 2 (4 layers
alternating sliding-window and global, attention and final logit softcaps); Llama (plain,
linear RoPE scaling with tied output, Llama 3 rope_freqs, the mistral alias, YaRN); Phi-3 (fused attn_qkv
and gate|up ffn_up); Qwen2 (q/k/v biases, tied output); Qwen3 (per-head q/k RMS norms, head_dim
32 ≠ n_embd / n_heads); Qwen3-MoE (Qwen3's attention, 8 experts top-2 in every layer: Q8_0 gate/up,
Q4_K / Q8_0 down, F32 router); gpt-oss (q/k/v/o biases, attention sinks, a window on the even layer,
YaRN, 8 MXFP4 experts top-4 with router and expert biases and the clamped SwiGLU; tests/models/test_gpt_oss.py
has the rest).
"""

import numpy as np
import pytest

import tests.helpers.numpy_ops as numpy_ops
from edged.models import load_model
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import Seq, ShuffledBlocks, make_batch
from tests.models.tiny_checks import BACKENDS, TinyCase, check, decode, mixed_batch, prefill, rel_err


def _gemma3_loaded(model, gf):
    windows = [model.layer_window(i) for i in range(6)]
    assert windows == ([4] * 5 + [0] if model.hparams.sliding_window else [0] * 6)


def _gemma2_loaded(model, gf):
    assert [model.layer_window(i) for i in range(4)] == [4, 0, 4, 0]
    assert (model.attn_softcap, model.final_softcap) == (0.5, 1.0) and model.layers[0].attn.q_norm is None


def _llama_loaded(model, gf):
    rope = model.layers[0].rope
    assert not rope.neox and model.n_layers == 2
    if gf.architecture == "llama" and "rope_freqs.weight" in gf.tensors:
        assert rope.freq_factors is not None and rope.freq_factors.shape == (8,)
    if model.hparams.rope_scaling == "linear":
        assert rope.freq_scale == 0.5 and model.output is model.token_embd
    if model.hparams.rope_scaling == "yarn":
        assert (rope.freq_scale, rope.ext_factor, rope.orig_ctx) == (0.25, 1.0, 64)


def _phi3_loaded(model, gf):
    lw = model.layers[0]
    assert lw.attn.wqkv.shape == (192, 64) and lw.attn.wq is None
    assert lw.ffn.gate is None and lw.ffn.up.shape == (512, 64)
    assert lw.rope.neox and lw.window == 0


def _qwen2_loaded(model, gf):
    a = model.layers[0].attn
    assert a.bq.shape == (64,) and a.bk.shape == (32,) and a.bv.shape == (32,)
    assert model.layers[0].rope.neox and model.output is model.token_embd  # tied


def _qwen3_loaded(model, gf):
    a = model.layers[1].attn
    assert model.head_dim == 32 and a.wq.shape == (128, 64) and a.q_norm.shape == (32,)
    assert model.layers[0].rope.neox and model.output is not model.token_embd


def _qwen3moe_loaded(model, gf):
    _qwen3_loaded(model, gf)
    moe = model.layers[0].moe
    assert model.layers[0].ffn is None and (moe.n_expert, moe.n_expert_used) == (8, 2)
    assert moe.up_exps.shape == (8, 256, 64) and moe.down_exps.qtype.name == "Q4_K"


def _gpt_oss_loaded(model, gf):
    a, lw = model.layers[0].attn, model.layers[0]
    assert [model.layer_window(i) for i in range(2)] == [4, 0]  # the even layers slide
    assert a.bq.shape == (128,) and a.bo.shape == (64,) and a.sinks.shape == (4,)
    assert lw.rope.neox and (lw.rope.ext_factor, lw.rope.freq_scale, lw.rope.orig_ctx) == (1.0, 0.25, 64)
    assert (lw.moe.gating, lw.moe.n_expert, lw.moe.n_expert_used) == ("softmax_topk", 8, 4)
    assert lw.moe.gate_inp_b.shape == (8,) and lw.moe.down_exps_b.shape == (8, 64)
    assert lw.moe.up_exps.qtype.name == lw.moe.down_exps.qtype.name == "MXFP4"
    assert model.ffn_act == "swiglu_oai" and model.output is not model.token_embd


# case id -> (architecture, write_tiny_model options, check of what loaded)
VARIANTS = {
    "gemma3-window4": ("gemma3", dict(sliding_window=4), _gemma3_loaded),
    "gemma3-no_window": ("gemma3", dict(sliding_window=0), _gemma3_loaded),
    "gemma2-window4": ("gemma2", {}, _gemma2_loaded),
    "llama-plain": ("llama", {}, _llama_loaded),
    "llama-linear_tied": ("llama", dict(rope_scaling="linear", tied=True), _llama_loaded),
    "llama-rope_freqs": ("llama", dict(rope_freqs=True), _llama_loaded),
    "llama-mistral": ("llama", dict(arch_name="mistral"), _llama_loaded),
    "llama-yarn": ("llama", dict(rope_scaling="yarn"), _llama_loaded),
    "phi3": ("phi3", {}, _phi3_loaded),
    "qwen2": ("qwen2", {}, _qwen2_loaded),
    "qwen3": ("qwen3", {}, _qwen3_loaded),
    "qwen3moe": ("qwen3moe", {}, _qwen3moe_loaded),
    "gpt-oss": ("gpt-oss", {}, _gpt_oss_loaded),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request):
    return request.param


@pytest.fixture(scope="module")
def case(variant, tmp_path_factory):
    arch, options, _ = VARIANTS[variant]
    return TinyCase(write_tiny_model(tmp_path_factory.mktemp(variant) / "m.gguf", arch, **options))


@pytest.fixture(scope="module")
def other(case):
    return TinyCase(case.path, n_tokens=10, seed=7)


def test_loaded(variant, case):
    VARIANTS[variant][2](case.model("numpy"), case.gf)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill(case, backend):
    check(case, backend, prefill, 16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [16, 4])
def test_decode(case, backend, block_size):
    check(case, backend, decode, block_size)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_batch(case, other, backend):
    check(case, backend, mixed_batch, other, 4)


def test_chunk_without_logit_rows(case):
    """A prefill chunk that needs no logits still stores its KV; the next chunk sees it."""
    model = case.model("numpy")
    kv, alloc, seq = model.allocate_kv(6, 4), ShuffledBlocks(6), Seq()
    first = make_batch([seq], [case.tokens[:6]], alloc, 4)
    first.logits_indices = np.zeros(0, np.int32)
    assert model.forward(first, kv).shape == (0, model.vocab_size)
    rest = model.forward(make_batch([seq], [case.tokens[6:]], alloc, 4), kv)
    assert rel_err(rest[0], case.ref_logits[-1]) <= 1e-4


def test_gemma3_sliding_window_matters(tmp_path):
    # the sequence (13 tokens) is longer than the window: local layers must see fewer keys
    windowed, full = (TinyCase(write_tiny_model(tmp_path / f"w{w}.gguf", "gemma3", sliding_window=w))
                      for w in (4, 0))
    assert np.abs(full.ref_logits[-1] - windowed.ref_logits[-1]).max() > 1e-3


def test_yarn_matters(tmp_path):
    """YaRN's ramp and its cos/sin scale move the logits (the reference honours the metadata)."""
    yarn, linear = (TinyCase(write_tiny_model(tmp_path / f"{s}.gguf", "llama", rope_scaling=s))
                    for s in ("yarn", "linear"))
    plain = TinyCase(write_tiny_model(tmp_path / "none.gguf", "llama"))
    for other in (linear, plain):
        assert np.abs(yarn.ref_logits[-1] - other.ref_logits[-1]).max() > 1e-3


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "qwen3moe", "phi3"])
def test_yarn_metadata_reaches_the_llama_family(tmp_path, arch):
    model = load_model(load_gguf(write_tiny_model(tmp_path / "m.gguf", arch, rope_scaling="yarn")), numpy_ops)
    rope = model.layers[0].rope
    yarn = (rope.ext_factor, rope.freq_scale, rope.orig_ctx, rope.beta_fast, rope.beta_slow)
    assert yarn == (1.0, 0.25, 64, 32.0, 1.0)
    assert rope.attn_factor == pytest.approx(1.0, abs=1e-6)  # the rope op scales by 1 + 0.1 ln 4 itself
