"""cpu.moe_matmul (every chosen expert's matmul in one call) against matmul of each expert's slab,
bit for bit: the fused K-quant, low-bit and legacy kernels (small groups), the per-group fallback
(large groups, other types: IQ2_XS, F16), one and two weights; bad groups refused. And
models/moe.py's moe_ffn through it equals the per-expert path a backend without moe_matmul takes,
bit for bit.
"""

import importlib
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.models.moe import MoEWeights, moe_ffn
from edged.quant.tensor import QTensor
from tests.helpers.qdata import random_qtensor

E = 6


def _stacked(qtype, m, k, seed, name="w") -> QTensor:
    q = random_qtensor(qtype, E * m, k, seed=seed, name=name)
    return QTensor(name, qtype, (E, m, k), q.data)


# groups of 1, 2, 3, 4 pairs (the fused kernel's nt = 1 / 2 / 2+1 / 4) and 6 (> gemv_max_n: matmul)
ROWS = np.array([3, 0, 5, 1, 2, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 6], np.int32)
EXPERTS = np.array([4, 0, 2, 5, 1, 3])
CUTS = np.array([0, 1, 3, 6, 10, 16, 16])  # the last group is empty


# Q8_0 k = 64: a partial 8-block group; Q5_0 k = 640: two groups and a last one of 4; m odd;
# MXFP4 k = 288: rows ending inside a 256-element unit (gpt-oss's k = 2880 does)
@pytest.mark.parametrize("qtype, m, k", [(T.Q4_K, 34, 256), (T.Q6_K, 16, 512), (T.Q8_0, 10, 64), (T.Q5_0, 19, 640),
                                         (T.Q4_1, 8, 256), (T.IQ4_NL, 5, 288), (T.MXFP4, 7, 288), (T.IQ1_M, 6, 256),
                                         (T.TQ2_0, 5, 512), (T.IQ2_XS, 4, 256), (T.F16, 9, 64)])
def test_equals_matmul_of_each_slab(qtype, m, k, monkeypatch):
    ws = (_stacked(qtype, m, k, 1, "gate"), _stacked(qtype, m, k, 2, "up"))
    x = np.random.default_rng(0).standard_normal((9, k)).astype(np.float32)
    mod = importlib.import_module("edged.backends.cpu.moe_matmul")
    per_group = []  # the fallback's matmul calls: only groups past the gemv threshold for fused types
    monkeypatch.setattr(mod, "matmul", lambda w, xr, **kw: per_group.append(len(xr)) or cpu.matmul(w, xr, **kw))
    fused = mod.kind_of(ws[0]) is not None or qtype in mod._EXPERTS_LEGACY or qtype in mod.LOWBIT_KINDS
    sizes = [int(b - a) for a, b in zip(CUTS[:-1], CUTS[1:]) if b > a]
    for use in (ws, ws[1:]):
        per_group.clear()
        ys = cpu.moe_matmul(use, x, ROWS, EXPERTS, CUTS)
        want_calls = [n for n in sizes if not fused or n > mod.gemv_max_n(qtype)] * len(use)
        assert sorted(per_group) == sorted(want_calls)
        assert len(ys) == len(use)
        for w, y in zip(use, ys):
            assert y.shape == (len(ROWS), m) and y.dtype == np.float32
            for g, e in enumerate(EXPERTS):
                a, b = CUTS[g], CUTS[g + 1]
                want = cpu.matmul(w.slab(e), x[ROWS[a:b]])
                assert np.array_equal(y[a:b], want), (w.name, g)


def test_row_alone_equals_row_in_groups():
    """A pair's row does not depend on the other pairs of its group (batch invariance)."""
    w = _stacked(T.Q4_K, 20, 256, 3)
    x = np.random.default_rng(1).standard_normal((9, 256)).astype(np.float32)
    y, = cpu.moe_matmul((w,), x, ROWS, EXPERTS, CUTS)
    for p in (0, 2, 5, 9, 12):
        g = int(np.searchsorted(CUTS, p, side="right")) - 1
        alone, = cpu.moe_matmul((w,), x, ROWS[p : p + 1], EXPERTS[g : g + 1], np.array([0, 1]))
        assert np.array_equal(alone[0], y[p]), p


def test_bad_groups_and_weights():
    w = _stacked(T.Q4_K, 16, 256, 4)
    x = np.zeros((9, 256), np.float32)
    with pytest.raises(ValueError, match=r"expert ids must be in \[0, 6\)"):
        cpu.moe_matmul((w,), x, ROWS, np.array([4, 0, 2, 6, 1, 3]), CUTS)
    with pytest.raises(ValueError, match=r"rows must be in \[0, 8\)"):
        cpu.moe_matmul((w,), x[:8], ROWS, EXPERTS, CUTS)
    with pytest.raises(ValueError, match="cuts must rise"):
        cpu.moe_matmul((w,), x, ROWS, EXPERTS, np.array([0, 3, 1, 6, 10, 16, 16]))
    with pytest.raises(ValueError, match="cuts must rise"):
        cpu.moe_matmul((w,), x, ROWS, EXPERTS, CUTS[:-1])
    with pytest.raises(ValueError, match=r"differ in shape"):
        cpu.moe_matmul((w, _stacked(T.Q4_K, 32, 256, 5)), x, ROWS, EXPERTS, CUTS)
    with pytest.raises(ValueError, match=r"needs float32 x of shape \[n, 256\]"):
        cpu.moe_matmul((w,), x[:, :128], ROWS, EXPERTS, CUTS)
    with pytest.raises(ValueError, match="3-D"):
        cpu.moe_matmul((w.slab(0),), x, ROWS, EXPERTS, CUTS)


def _per_expert_ops():
    """The CPU backend without moe_matmul and moe_ffn_step: moe_ffn's per-expert path (what other
    backends run)."""
    return SimpleNamespace(**{name: getattr(cpu, name) for name in cpu.__all__
                              if name not in ("moe_matmul", "moe_ffn_step")})


@pytest.mark.parametrize("fused, biases", [(False, False), (True, True)])
def test_moe_ffn_same_bits_as_per_expert(fused, biases):
    """7 tokens whose first choice is expert 1 (a group of 7: matmul) and the rest spread (groups
    of 1-4: the fused kernel), Q4_K gate/up and Q6_K down; and at decode, one token."""
    d, ff, rng = 256, 256, np.random.default_rng(2)
    up = _stacked(T.Q4_K, 2 * ff if fused else ff, d, 6, "up")
    mw = MoEWeights(
        gate_inp=QTensor("router", T.F32, (E, d), (rng.standard_normal((E, d)) * 0.3).astype(np.float32).view(np.uint8).ravel()),
        up_exps=up, down_exps=_stacked(T.Q6_K, d, ff, 7, "down"),
        gate_exps=None if fused else _stacked(T.Q4_K, ff, d, 8, "gate"), n_expert_used=3, norm_topk=True)
    mw.gate_inp_b = np.where(np.arange(E) == 1, 20.0, 0.0).astype(np.float32)
    if biases:
        mw.up_exps_b = (rng.standard_normal((E, up.shape[1])) * 0.1).astype(np.float32)
        mw.down_exps_b = (rng.standard_normal((E, d)) * 0.1).astype(np.float32)
    h = rng.standard_normal((7, d)).astype(np.float32)
    act = "gelu_tanh" if fused else "silu"
    for x in (h, h[2:3]):
        got = moe_ffn(cpu, mw, x, act)
        assert np.array_equal(got, moe_ffn(_per_expert_ops(), mw, x, act))


def test_moe_combine_serial_and_parallel_same_bits():
    """moe_combine sums a few tokens in the calling thread and more in the thread pool: same bits,
    both equal to float32 sums in each token's rank order."""
    rng = np.random.default_rng(3)
    y = rng.standard_normal((60, 1024)).astype(np.float32)
    src = rng.integers(0, 60, (20, 3)).astype(np.int32)  # 20 tokens x 1024 > SERIAL_ELEMENTS
    w = rng.standard_normal((20, 3)).astype(np.float32)
    want = w[:, :1] * y[src[:, 0]] + w[:, 1:2] * y[src[:, 1]] + w[:, 2:] * y[src[:, 2]]
    batch = cpu.moe_combine([y[:25], y[25:]], src, w)
    assert np.array_equal(batch, want)
    for t in range(0, 20, 7):
        assert np.array_equal(cpu.moe_combine([y], src[t : t + 1], w[t : t + 1])[0], batch[t])
