"""cpu.moe_ffn_step (a decode step's routed experts and their sum in one call) against the general
path it stands for (moe_matmul for gate and up, silu_mul, moe_matmul for down, moe_combine), bit
for bit: K-quant types, raw and paired stacks, one to three tokens; None where it does not apply;
bad routing refused. cpu.moe_block_step (the router's matmul and the routing too) against the
router's matmul, route_groups and that path, for each gating. And moe_ffn takes them at decode
with the same bits.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.backends.cpu.kquant_pairs import paired
from edged.backends.cpu.matmul import gemv_max_n
from edged.backends.cpu.moe_route import route_groups
from edged.models.moe import MoEWeights, moe_ffn
from edged.quant.tensor import QTensor
from tests.helpers.qdata import random_qtensor

E, D, FF = 8, 256, 512


def _stacked(qtype, m, k, seed, name, pair=False) -> QTensor:
    q = random_qtensor(qtype, E * m, k, seed=seed, name=name)
    w = QTensor(name, qtype, (E, m, k), q.data)
    return paired(w) if pair else w


def _routed(n, k, seed):
    """(weights, tokens, experts, cuts, src) of n tokens' random router logits, top-k of E."""
    logits = np.random.default_rng(seed).standard_normal((n, E)).astype(np.float32)
    _, weights, tokens, experts, cuts, src = route_groups(logits, k, "softmax", True)
    return weights, tokens, experts, cuts, src


def _general(gate, up, down, h, weights, tokens, experts, cuts, src):
    g, u = cpu.moe_matmul((gate, up), h, tokens, experts, cuts)
    y, = cpu.moe_matmul((down,), cpu.silu_mul(g, u), np.arange(len(tokens), dtype=np.int32), experts, cuts)
    return cpu.moe_combine([y], src, weights)


@pytest.mark.parametrize("gu, down, pair", [(T.Q4_K, T.Q6_K, True), (T.Q4_K, T.Q4_K, False), (T.Q5_K, T.Q3_K, True),
                                            (T.IQ4_XS, T.Q2_K, False)])
@pytest.mark.parametrize("n, k", [(1, 4), (2, 2), (3, 3)])
def test_same_bits_as_the_general_path(gu, down, pair, n, k):
    gate, up = _stacked(gu, FF, D, 1, "gate", pair), _stacked(gu, FF, D, 2, "up", pair)
    dn = _stacked(down, D, FF, 3, "down", pair)
    h = np.random.default_rng(n).standard_normal((n, D)).astype(np.float32)
    weights, tokens, experts, cuts, src = _routed(n, k, 10 * n + k)
    got = cpu.moe_ffn_step(gate, up, dn, h, tokens, experts, cuts, src, weights, "silu")
    assert got is not None and got.shape == (n, D) and got.dtype == np.float32
    assert np.array_equal(got, _general(gate, up, dn, h, weights, tokens, experts, cuts, src))


def test_a_token_alone_gets_its_bits_from_a_batch():
    gate, up = _stacked(T.Q4_K, FF, D, 4, "gate", True), _stacked(T.Q4_K, FF, D, 5, "up", True)
    dn = _stacked(T.Q6_K, D, FF, 6, "down", True)
    rng = np.random.default_rng(7)
    h = rng.standard_normal((3, D)).astype(np.float32)
    logits = rng.standard_normal((3, E)).astype(np.float32)
    _, w, tok, ex, cuts, src = route_groups(logits, 2, "softmax", False)
    batch = cpu.moe_ffn_step(gate, up, dn, h, tok, ex, cuts, src, w, "silu")
    for t in range(3):
        _, w1, tok1, ex1, cuts1, src1 = route_groups(logits[t : t + 1], 2, "softmax", False)
        alone = cpu.moe_ffn_step(gate, up, dn, h[t : t + 1], tok1, ex1, cuts1, src1, w1, "silu")
        assert np.array_equal(alone[0], batch[t]), t


def test_none_where_it_does_not_apply():
    gate, up, dn = _stacked(T.Q4_K, FF, D, 1, "gate"), _stacked(T.Q4_K, FF, D, 2, "up"), _stacked(T.Q6_K, D, FF, 3, "down")
    h = np.random.default_rng(0).standard_normal((1, D)).astype(np.float32)
    weights, tokens, experts, cuts, src = _routed(1, 2, 0)
    args = (h, tokens, experts, cuts, src, weights)
    assert cpu.moe_ffn_step(gate, up, dn, *args, "gelu_tanh") is None
    legacy = _stacked(T.Q8_0, FF, D, 4, "up")
    assert cpu.moe_ffn_step(gate, legacy, dn, *args, "silu") is None
    assert cpu.moe_ffn_step(gate, _stacked(T.Q5_K, FF, D, 5, "up"), dn, *args, "silu") is None  # gate, up differ
    assert cpu.moe_ffn_step(paired(gate), up, dn, *args, "silu") is None  # one paired (repacked), one raw
    # 9 tokens all on expert 0 at rank 0: a group past the gemv's batch
    n = 9
    hb = np.random.default_rng(1).standard_normal((n, D)).astype(np.float32)
    logits = np.zeros((n, E), np.float32)
    logits[:, 0] = 5.0
    _, w, tok, ex, cu, sr = route_groups(logits, 1, "softmax", False)
    assert cpu.moe_ffn_step(gate, up, dn, hb, tok, ex, cu, sr, w, "silu") is None


def test_bad_routing_refused():
    gate, up, dn = _stacked(T.Q4_K, FF, D, 1, "gate"), _stacked(T.Q4_K, FF, D, 2, "up"), _stacked(T.Q6_K, D, FF, 3, "down")
    h = np.zeros((1, D), np.float32)
    weights, tokens, experts, cuts, src = _routed(1, 2, 0)
    with pytest.raises(ValueError, match=r"src indices must be in \[0, 2\)"):
        cpu.moe_ffn_step(gate, up, dn, h, tokens, experts, cuts, src + 2, weights, "silu")
    with pytest.raises(ValueError, match=r"expert ids must be in \[0, 8\)"):
        cpu.moe_ffn_step(gate, up, dn, h, tokens, experts + E, cuts, src, weights, "silu")
    with pytest.raises(ValueError, match=r"rows must be in \[0, 1\)"):
        cpu.moe_ffn_step(gate, up, dn, h, tokens + 1, experts, cuts, src, weights, "silu")
    with pytest.raises(ValueError, match="does not fit"):
        cpu.moe_ffn_step(gate, up, _stacked(T.Q6_K, D, 2 * FF, 3, "down"), h, tokens, experts, cuts, src, weights,
                         "silu")
    with pytest.raises(ValueError, match=r"must be \[1, k\]"):
        cpu.moe_ffn_step(gate, up, dn, h, tokens, experts, cuts, src[:, :1], weights, "silu")


def _router(seed) -> QTensor:
    w = (np.random.default_rng(seed).standard_normal((E, D)) * 0.3).astype(np.float32)
    return QTensor("router", T.F32, (E, D), w.view(np.uint8).ravel())


# (gating, norm_topk, scale, gate_b, probs_b): qwen3moe's, gpt-oss's selection, deepseek's
GATINGS = [("softmax", True, 1.0, None, None),
           ("softmax_topk", False, 1.0, np.linspace(-1, 1, E, dtype=np.float32), None),
           ("sigmoid", True, 2.5, None, np.linspace(0.5, -0.5, E, dtype=np.float32))]


@pytest.mark.parametrize("gating", GATINGS, ids=lambda g: g[0])
@pytest.mark.parametrize("n", [1, 3])
def test_block_step_same_bits_as_router_then_general_path(gating, n):
    """moe_block_step = matmul of the router, route_groups, then the general experts path."""
    name, norm, scale, gate_b, probs_b = gating
    router = _router(n)
    gate, up = _stacked(T.Q4_K, FF, D, 1, "gate", True), _stacked(T.Q4_K, FF, D, 2, "up", True)
    dn = _stacked(T.Q6_K, D, FF, 3, "down", True)
    h = np.random.default_rng(20 + n).standard_normal((n, D)).astype(np.float32)
    _, w, tok, ex, cuts, src = route_groups(cpu.matmul(router, h), 3, name, norm, scale, gate_b, probs_b)
    got = cpu.moe_block_step(router, 3, name, norm, scale, gate_b, probs_b, gate, up, dn, h, "silu")
    assert got is not None and np.array_equal(got, _general(gate, up, dn, h, w, tok, ex, cuts, src))


def test_block_step_none_or_refused():
    gate, up, dn = _stacked(T.Q4_K, FF, D, 1, "gate"), _stacked(T.Q4_K, FF, D, 2, "up"), _stacked(T.Q6_K, D, FF, 3, "down")
    router = _router(0)
    h = np.random.default_rng(0).standard_normal((1, D)).astype(np.float32)
    args = (gate, up, dn, h, "silu")
    assert cpu.moe_block_step(router, 2, "softmax", True, 1.0, None, None, *args) is not None
    many = np.zeros((gemv_max_n(T.Q4_K) + 1, D), np.float32)  # past the gemv's batch: the general path
    assert cpu.moe_block_step(router, 2, "softmax", True, 1.0, None, None, gate, up, dn, many, "silu") is None
    f16 = QTensor("router", T.F16, (E, D), np.zeros(E * D, np.float16).view(np.uint8))
    assert cpu.moe_block_step(f16, 2, "softmax", True, 1.0, None, None, *args) is None
    assert cpu.moe_block_step(router, 2, "softmax", True, 1.0, None, None, gate, up, dn, h, "gelu_tanh") is None
    with pytest.raises(ValueError, match="do not fit"):
        cpu.moe_block_step(router, E + 1, "softmax", True, 1.0, None, None, *args)
    small = QTensor("router", T.F32, (E - 1, D), np.zeros((E - 1) * D, np.float32).view(np.uint8))
    with pytest.raises(ValueError, match="do not fit"):
        cpu.moe_block_step(small, 2, "softmax", True, 1.0, None, None, *args)


def test_moe_ffn_takes_the_steps_at_decode():
    """moe_ffn at one token runs moe_block_step (the router, the routing and the experts in one
    call); without it, moe_ffn_step after the routing; both give the bits of the CPU backend
    without either."""
    rng = np.random.default_rng(5)
    mw = MoEWeights(gate_inp=_router(5), up_exps=_stacked(T.Q4_K, FF, D, 6, "up", True),
                    down_exps=_stacked(T.Q6_K, D, FF, 7, "down"), gate_exps=_stacked(T.Q4_K, FF, D, 8, "gate", True),
                    n_expert_used=3, norm_topk=True)
    h = rng.standard_normal((1, D)).astype(np.float32)

    def ops_without(*names):
        calls = []
        ops = SimpleNamespace(**{name: getattr(cpu, name) for name in cpu.__all__ if name not in names})
        for name in ("moe_block_step", "moe_ffn_step"):
            if hasattr(ops, name):
                setattr(ops, name, lambda *a, name=name: calls.append(name) or getattr(cpu, name)(*a))
        return ops, calls

    want = moe_ffn(ops_without("moe_block_step", "moe_ffn_step")[0], mw, h, "silu")
    ops, calls = ops_without()
    assert np.array_equal(moe_ffn(ops, mw, h, "silu"), want) and calls == ["moe_block_step"]
    ops, calls = ops_without("moe_block_step")
    assert np.array_equal(moe_ffn(ops, mw, h, "silu"), want) and calls == ["moe_ffn_step"]
