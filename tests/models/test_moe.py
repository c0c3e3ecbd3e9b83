"""The mixture-of-experts block (models/moe.py) against a float64 numpy loop over tokens and their
chosen experts, per gating mode; batch invariance; the CPU moe_combine op; qwen3moe's metadata
checks and placement.

Bounds: F16 experts and an F32 router take float32 activations in the CPU matmul (no int8
rounding), so moe_ffn on the CPU backend is within 1e-5 (relative to the largest output) of the
float64 loop; measured 1.4-2.1e-7.
"""

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.models import load_model
from edged.models.decoder import FeedForwardWeights
from edged.models.errors import ModelError
from edged.models.hparams import read_expert_hparams
from edged.models.moe import MoEWeights, moe_ffn, route
from edged.quant import load_gguf
from edged.quant.tensor import QTensor
from tests.helpers.fake_device import DeviceArray, make_fake_device
from tests.helpers.qdata import random_qtensor, reference_dequantize
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy

E, K, D, FF = 8, 2, 64, 32  # experts, experts per token, n_embd, n_ff_exp
BOUND = 1e-5


def _f32(name, a) -> QTensor:
    a = np.ascontiguousarray(a, dtype=np.float32)
    return QTensor(name, T.F32, a.shape, a.reshape(-1).view(np.uint8))


def _stacked(qtype, rows, cols, seed, name) -> QTensor:
    """[E, rows, cols] of random valid blocks (F16: |w| ~ 0.05)."""
    q = random_qtensor(qtype, E * rows, cols, seed=seed, name=name)
    return QTensor(name, qtype, (E, rows, cols), q.data)


def _weights(gating="softmax", *, norm=False, scale=1.0, biases=False, probs_bias=False, shared=False,
             fused=False, qtype=T.F16, seed=0, d=D, ff=FF) -> MoEWeights:
    rng = np.random.default_rng(seed)
    mw = MoEWeights(
        gate_inp=_f32("router", rng.standard_normal((E, d)) * 0.3),
        up_exps=_stacked(qtype, 2 * ff if fused else ff, d, seed + 1, "up"),
        down_exps=_stacked(qtype, d, ff, seed + 2, "down"),
        gate_exps=None if fused else _stacked(qtype, ff, d, seed + 3, "gate"),
        n_expert_used=K, gating=gating, norm_topk=norm, weights_scale=scale)
    if biases:
        mw.gate_inp_b = (rng.standard_normal(E) * 0.5).astype(np.float32)
        mw.up_exps_b = (rng.standard_normal((E, 2 * ff if fused else ff)) * 0.1).astype(np.float32)
        if not fused:
            mw.gate_exps_b = (rng.standard_normal((E, ff)) * 0.1).astype(np.float32)
        mw.down_exps_b = (rng.standard_normal((E, d)) * 0.1).astype(np.float32)
    if probs_bias:  # large enough to change which experts win
        mw.exp_probs_b = (rng.standard_normal(E) * 0.5).astype(np.float32)
    if shared:
        mw.shared = FeedForwardWeights(up=random_qtensor(qtype, 48, d, seed=seed + 4, name="sh_up"),
                                       down=random_qtensor(qtype, d, 48, seed=seed + 5, name="sh_down"),
                                       gate=random_qtensor(qtype, 48, d, seed=seed + 6, name="sh_gate"))
        mw.shared_gate = _f32("sh_gate_inp", rng.standard_normal((1, d)) * 0.3)
    return mw


def _act(name, g, u):
    if name == "silu":
        return g / (1 + np.exp(-g)) * u
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u


def expected(mw: MoEWeights, h: np.ndarray, act: str = "silu") -> np.ndarray:
    """float64, one token and one chosen expert at a time (llama.cpp's build_moe_ffn semantics)."""
    W = lambda q: reference_dequantize(q).astype(np.float64)  # noqa: E731
    h = h.astype(np.float64)
    logits = h @ W(mw.gate_inp).T + (0 if mw.gate_inp_b is None else mw.gate_inp_b)
    if mw.gating == "softmax":
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
    elif mw.gating == "sigmoid":
        probs = 1 / (1 + np.exp(-logits))
    else:
        probs = logits
    select = probs + (0 if mw.exp_probs_b is None else mw.exp_probs_b)
    up, down = W(mw.up_exps), W(mw.down_exps)
    gate = None if mw.gate_exps is None else W(mw.gate_exps)
    bias = lambda b, e: 0 if b is None else b[e]  # noqa: E731
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-select[t], kind="stable")[: mw.n_expert_used]
        w = probs[t, top]
        if mw.gating == "softmax_topk":
            w = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
        if mw.norm_topk:
            w = w / max(w.sum(), 6.103515625e-5)
        for e, wt in zip(top, w * mw.weights_scale):
            if gate is None:
                g, u = np.split(up[e] @ h[t] + bias(mw.up_exps_b, e), 2)
            else:
                g, u = gate[e] @ h[t] + bias(mw.gate_exps_b, e), up[e] @ h[t] + bias(mw.up_exps_b, e)
            out[t] += wt * (down[e] @ _act(act, g, u) + bias(mw.down_exps_b, e))
    if mw.shared is not None:
        s = W(mw.shared.down) @ _act(act, W(mw.shared.gate) @ h.T, W(mw.shared.up) @ h.T)  # [D, n]
        out += (s / (1 + np.exp(-(h @ W(mw.shared_gate).T)).T)).T
    return out


CASES = {
    "softmax": (dict(gating="softmax"), "silu"),
    "softmax_norm": (dict(gating="softmax", norm=True), "silu"),  # qwen3moe
    "softmax_topk_biases": (dict(gating="softmax_topk", biases=True), "silu"),  # gpt-oss
    "sigmoid_probs_bias_norm_scale": (dict(gating="sigmoid", probs_bias=True, norm=True, scale=2.5), "silu"),
    "shared_expert": (dict(gating="softmax", norm=True, shared=True), "silu"),  # qwen2moe
    "fused_gate_up_gelu": (dict(gating="softmax", fused=True, biases=True), "gelu_tanh"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_moe_ffn_matches_float64(case):
    kw, act = CASES[case]
    mw = _weights(**kw)
    h = np.random.default_rng(1).standard_normal((11, D)).astype(np.float32)
    want = expected(mw, h, act)
    got = moe_ffn(cpu, mw, h, act)
    assert got.shape == (11, D) and got.dtype == np.float32
    assert np.abs(got - want).max() / np.abs(want).max() <= BOUND


def test_each_option_changes_the_output():
    """The float64 loop itself depends on every option the cases above turn on (else they prove nothing)."""
    h = np.random.default_rng(1).standard_normal((11, D)).astype(np.float32)
    base = expected(_weights(), h)
    for kw in (dict(norm=True), dict(gating="softmax_topk"), dict(gating="sigmoid"), dict(probs_bias=True),
               dict(biases=True), dict(shared=True), dict(scale=2.5)):
        assert np.abs(expected(_weights(**kw), h) - base).max() > 1e-3, kw


def test_route_ties_bias_and_weights():
    mw = _weights(gating="sigmoid", norm=False)
    # ties: equal logits pick the lower expert ids, in order
    chosen, w = route(mw, np.zeros((2, E), np.float32))
    assert chosen.tolist() == [[0, 1], [0, 1]] and np.allclose(w, 0.5)
    # exp_probs_b moves the selection but the weights stay the unbiased probs
    logits = np.array([[3, 2, 1, 0, 0, 0, 0, 0]], np.float32)
    mw.exp_probs_b = np.array([0, 0, 0, 0, 0, 0, 0, 5], np.float32)
    chosen, w = route(mw, logits)
    assert chosen.tolist() == [[7, 0]]
    assert np.allclose(w, 1 / (1 + np.exp(-np.array([[0.0, 3.0]]))))


@pytest.mark.parametrize("qtype, d, ff", [(T.Q8_0, D, FF), (T.Q4_K, 256, 256)])
def test_batch_invariance(qtype, d, ff):
    """Each token's output is bit-identical alone and in a batch of 7 whose tokens all pick
    expert 3 first (one group of 7: the matmul's batched path) and spread over the others."""
    mw = _weights(gating="softmax", norm=True, qtype=qtype, seed=3, d=d, ff=ff)
    mw.gate_inp_b = np.where(np.arange(E) == 3, 20.0, 0.0).astype(np.float32)
    h = np.random.default_rng(5).standard_normal((7, d)).astype(np.float32)
    chosen, _ = route(mw, cpu.matmul(mw.gate_inp, h))
    assert (chosen[:, 0] == 3).all() and len(set(chosen[:, 1].tolist())) >= 3
    batch = moe_ffn(cpu, mw, h, "silu")
    for t in range(7):
        assert np.array_equal(moe_ffn(cpu, mw, h[t : t + 1], "silu")[0], batch[t]), t


def test_moe_combine_adds_in_rank_order():
    """cpu.moe_combine is bit-identical to float32 sums taken in each token's own order."""
    rng = np.random.default_rng(0)
    ys = [rng.standard_normal((m, 40)).astype(np.float32) for m in (3, 1, 5)]
    y = np.concatenate(ys)
    src = rng.permutation(9)[:6].reshape(3, 2).astype(np.int32)
    src = np.concatenate([src, src[:, :1]], axis=1)  # [3, 3]
    w = rng.standard_normal((3, 3)).astype(np.float32)
    want = np.zeros((3, 40), np.float32)
    for j in range(3):
        want = want + w[:, j : j + 1] * y[src[:, j]]
    assert np.array_equal(cpu.moe_combine(ys, src, w), want)
    with pytest.raises(ValueError, match="src indices"):
        cpu.moe_combine(ys, np.array([[9]], np.int32), np.ones((1, 1), np.float32))


# --- qwen3moe files -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3moe(tmp_path_factory):
    return load_gguf(write_tiny_model(tmp_path_factory.mktemp("q3moe") / "m.gguf", "qwen3moe", seed=4))


U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


def test_qwen3moe_decode_steps_keep_the_bits(tmp_path, monkeypatch):
    """With Q4_K experts (n_embd 256) the decode steps run the CPU's one-call MoE block
    (moe_block_step), and the greedy tokens and every step's top-5 logprobs equal those of the
    general path (the backend without the fused steps)."""
    gf = load_gguf(write_tiny_model(tmp_path / "m.gguf", "qwen3moe", seed=6, n_embd=256, expert_type=T.Q4_K))
    calls = []
    real = cpu.moe_block_step
    monkeypatch.setattr(cpu, "moe_block_step", lambda *a: calls.append(a[-2].shape[0]) or real(*a))
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    fused = greedy(load_model(gf), prompt, 6)
    assert 1 in calls  # the decode tokens' layers
    monkeypatch.delattr(cpu, "moe_block_step")
    monkeypatch.delattr(cpu, "moe_ffn_step")
    plain = greedy(load_model(gf), prompt, 6)
    assert fused.ids == plain.ids and fused.steps == plain.steps


@pytest.mark.parametrize("kv, match", [
    ({"qwen3moe.expert_used_count": (0, U32)},
     r"qwen3moe\.expert_used_count = 0: must be in \[1, qwen3moe\.expert_count = 8\]"),
    ({"qwen3moe.expert_used_count": (9, U32)}, r"qwen3moe\.expert_used_count = 9"),
    ({"qwen3moe.expert_count": (0, U32)}, r"qwen3moe\.expert_count = 0"),
    ({"qwen3moe.expert_count": (4, U32)},
     r"tensor 'blk\.0\.ffn_gate_inp\.weight' has shape \(8, 64\), expected \(4, 64\)"),
    ({"qwen3moe.expert_feed_forward_length": (128, U32)},
     r"'blk\.0\.ffn_gate_exps\.weight' has shape \(8, 256, 64\), expected \(8, 128, 64\)"),
    ({"qwen3moe.expert_weights_scale": (-1.0, F32)}, r"qwen3moe\.expert_weights_scale = -1\.0"),
])
def test_bad_expert_metadata(tmp_path, kv, match):
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", extra_kv=kv)
    with pytest.raises(ModelError, match=match):
        load_model(load_gguf(path))


def test_missing_expert_tensor(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", omit=("blk.1.ffn_down_exps.weight",))
    with pytest.raises(ModelError, match=r"missing tensor 'blk\.1\.ffn_down_exps\.weight' \(expected shape \(8, 64, 256\)\)"):
        load_model(load_gguf(path))


def test_router_beyond_bounds_is_refused(tmp_path):
    """A 3e38 F32 router weight (the fuzzer's pattern) would make the logits inf: refused at load."""
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe")
    r = gguf.GGUFReader(str(path), "r+")
    next(t for t in r.tensors if t.name == "blk.0.ffn_gate_inp.weight").data.reshape(-1)[5] = 3e38
    r.data.flush()
    del r
    with pytest.raises(ModelError, match=r"'blk\.0\.ffn_gate_inp\.weight' holds 3e\+38"):
        load_model(load_gguf(path))


class _Meta:
    """The metadata accessors read_expert_hparams uses, over a dict."""

    def __init__(self, meta):
        self.architecture, self.path, self.meta = "m", "f.gguf", meta

    def __contains__(self, key):
        return key in self.meta

    def get_int(self, key):
        return self.meta[key]

    get_float = get_int


def test_expert_ff_defaults_like_llama_cpp():
    """Without expert_feed_forward_length, n_ff_exp = feed_forward_length / expert_used_count."""
    hp = SimpleNamespace(n_ff=768, extra={})
    ex = read_expert_hparams(_Meta({"m.expert_count": 8, "m.expert_used_count": 2}), hp)
    assert (ex.n_expert, ex.n_expert_used, ex.n_ff_exp, ex.weights_scale) == (8, 2, 384, 1.0)
    assert hp.extra["experts"] is ex


def test_qwen3moe_loaded(qwen3moe):
    model = load_model(qwen3moe)
    lw = model.layers[1]
    assert lw.ffn is None and lw.moe.n_expert == 8 and lw.moe.n_expert_used == 2
    assert lw.moe.gating == "softmax" and lw.moe.norm_topk
    assert lw.moe.down_exps.shape == (8, 64, 256) and lw.moe.down_exps.slab(5).shape == (64, 256)
    names = {n for n, _ in model.matrices()}
    assert {"blk.0.ffn_gate_inp.weight", "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"} <= names
    expert_bytes = sum(getattr(model.layers[0].moe, k).data.nbytes for k in ("gate_exps", "up_exps", "down_exps"))
    assert model.layer_bytes(0) > expert_bytes


def test_moe_layer_placement(qwen3moe):
    """A backend without moe_combine is refused naming the layer; one with it gives the host's tokens."""
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    ref = greedy(load_model(qwen3moe), prompt, 4)
    model = load_model(qwen3moe)
    with pytest.raises(ModelError, match=r"layer 1 \(blk\.1\): its mixture-of-experts weights cannot be placed.*moe_combine"):
        model.place([cpu, make_fake_device()], cpu)
    model.place([cpu, cpu], make_fake_device())  # output on the device, MoE layers on the host: fine
    assert greedy(model, prompt, 4).ids == ref.ids

    dev = make_fake_device()

    def moe_combine(ys, src, w):
        assert all(isinstance(y, DeviceArray) for y in ys) and not isinstance(w, DeviceArray)
        return cpu.moe_combine([y.view(np.ndarray) for y in ys], src, w).view(DeviceArray)

    dev.moe_combine = moe_combine
    model = load_model(qwen3moe)
    model.place([dev, dev], dev)
    placed = model._run_layers[0].moe
    assert isinstance(placed.up_exps, tuple) and len(placed.up_exps) == 8
    assert type(placed.up_exps[0]).__name__ == "DeviceMatrix" and placed.up_exps[0].shape == (256, 64)
    assert greedy(model, prompt, 4).ids == ref.ids
