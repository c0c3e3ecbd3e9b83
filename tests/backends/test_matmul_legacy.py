"""Legacy 32-element block kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) against gguf-py's
dequantize + numpy, through the dispatcher and through both kernels (gemv and gemm) directly."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numba as nb
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import matmul_legacy, simd
from edged.backends.cpu.act_quant import quantize_activations
from tests.helpers.qdata import random_qtensor, reference_dequantize

mm = sys.modules["edged.backends.cpu.matmul"]

# ||y - y_ref|| / ||y_ref|| bounds. The error is the int8 activation rounding (per-32 scales):
# median 0.53 % over this test matrix for every type; worst case (k=32, m=7, n=1: seven outputs of
# one block) measured Q8_0 0.74 %, Q5_0 0.89 %, Q4_0 1.51 %, Q4_1 1.55 %, IQ4_NL 1.63 %, Q5_1 2.01 %.
REL_BOUND = {T.Q8_0: 1.2e-2, T.Q5_0: 1.2e-2, T.Q4_0: 2.2e-2, T.Q4_1: 2.2e-2, T.IQ4_NL: 2.2e-2, T.Q5_1: 2.8e-2}
TYPES = list(REL_BOUND)
KS = [32, 64, 96, 640, 2048]
MS = [7, 33]
NS = [1, 3, 17, 64]


def rel_err(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def activations(n, k, seed):
    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)  # [n, k]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_matches_reference(qtype, k):
    for m in MS:
        w = random_qtensor(qtype, m, k, seed=k + m)
        wf = reference_dequantize(w)  # [m, k]
        for n in NS:
            x = activations(n, k, seed=n)
            y = mm.matmul(w, x)
            assert y.shape == (n, m) and y.dtype == np.float32
            err = rel_err(y, x @ wf.T)
            assert err <= REL_BOUND[qtype], f"{qtype.name} m={m} k={k} n={n}: rel err {err:.2e}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemv_and_gemm_agree(qtype):
    """Both kernels on the same quantized activations, for n values each path rarely sees
    (n=3 through gemm: a partial 16-token tile; n=17 through gemv: many tokens per row)."""
    m, k = 33, 96
    w = random_qtensor(qtype, m, k, seed=5)
    gemv, gemm = mm.kernels_for(qtype)
    for n in (3, 17):
        qx = quantize_activations(activations(n, k, seed=9))
        y1 = np.full((n, m), np.nan, np.float32)
        y2 = np.full((n, m), np.nan, np.float32)
        gemv(w.rows(), *qx, y1)
        gemm(w.rows(), *qx, y2)
        # same integer sums, same scales: only float summation order differs
        np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6 * np.abs(y1).max())


def test_gemm_many_passes():
    """n larger than one pass of token tiles (k=2048 -> 256 tokens a pass) and not a multiple of 16."""
    w = random_qtensor(T.Q8_0, 7, 2048, seed=3)
    x = activations(300, 2048, seed=4)
    err = rel_err(mm.matmul(w, x), x @ reference_dequantize(w).T)
    assert err <= REL_BOUND[T.Q8_0]


def test_exact_on_integer_activations():
    """x already on the int8 grid (one value of 127 per block): quantization is lossless, so the
    kernels must match the float reference to float rounding, not just within 1.5 %."""
    rng = np.random.default_rng(0)
    for qtype in TYPES:
        w = random_qtensor(qtype, 9, 64, seed=1)
        x = rng.integers(-127, 128, size=(20, 64)).astype(np.float32)
        x[:, ::32] = 127.0
        ref = x.astype(np.float64) @ reference_dequantize(w).astype(np.float64).T
        y = mm.matmul(w, x)
        assert rel_err(y, ref) < 1e-5, qtype.name


@pytest.mark.skipif(not simd.USE_VNNI, reason="host has no AVX-512 VNNI")
@pytest.mark.skipif(not nb.config.SLP_VECTORIZE, reason="numba was imported before edged set SLP")
@pytest.mark.parametrize("name", ["gemv_q8_0", "gemv_q4_0", "gemv_q5_0"])
def test_gemv_emits_vnni(name):
    """The block dot must compile to vpdpbusd (5-6x faster); checked on a serial, uncached copy
    because a parallel kernel's loop body lives in a separate gufunc that inspect_asm omits."""
    f = nb.njit(nogil=True, fastmath=False, cache=False)(getattr(matmul_legacy, name).py_func)
    w = random_qtensor(getattr(T, name.split("_", 1)[1].upper()), 2, 64)
    qx = quantize_activations(activations(1, 64, 0))
    f(w.rows(), *qx, np.zeros((1, 2), np.float32))
    assert "vpdpbusd" in f.inspect_asm(f.signatures[0])


def _row_tile_reference(u, stride, off, mask, d, c, xi, xdt, xst):
    nblk = d.shape[0]
    mbytes = np.frombuffer(np.uint32(mask).tobytes(), np.uint8)
    out = np.zeros(16, np.float64)
    for b in range(nblk):
        wb = (u[b * stride + off : b * stride + off + 32].reshape(8, 4) ^ mbytes).astype(np.int64)  # [8, 4]
        xb = xi[b * 512 : (b + 1) * 512].reshape(8, 16, 4).astype(np.int64)  # [8 groups, 16 tokens, 4]
        s = (wb[:, None, :] * xb).sum(axis=(0, 2))  # [16]
        out += xdt[b * 16 : (b + 1) * 16] * (d[b] * s + c[b] * xst[b * 16 : (b + 1) * 16])
    return out


@pytest.mark.parametrize("use_vnni", [False, True] if simd.USE_VNNI else [False])
def test_row_tile_dot_both_paths(use_vnni):
    """row_tile_dot on raw Q8_0-like rows (stride 34, xor 0x80) on the chosen codegen path."""
    rng = np.random.default_rng(3)
    nblk = 3
    u = rng.integers(0, 256, nblk * 34).astype(np.uint8)
    d = rng.standard_normal(nblk).astype(np.float32)
    c = rng.standard_normal(nblk).astype(np.float32)
    xi = rng.integers(-128, 128, nblk * 512).astype(np.int8)
    xdt = rng.random(nblk * 16).astype(np.float32)
    xst = rng.integers(-500, 500, nblk * 16).astype(np.float32)
    saved = simd.USE_VNNI
    try:
        simd.USE_VNNI = use_vnni

        @nb.njit(cache=False)
        def run(u, d, c, xi, xdt, xst, out):
            simd._row_tile_dot(u, 34, 2, 0x80808080, d, c, xi, xdt, xst, out)

        out = np.zeros(16, np.float32)
        run(u, d, c, xi, xdt, xst, out)
    finally:
        simd.USE_VNNI = saved
    ref = _row_tile_reference(u, 34, 2, 0x80808080, d, c, xi, xdt, xst)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-3)
    assert ("vpdpbusd" in run.inspect_asm(run.signatures[0])) == use_vnni


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_row_dot_portable_path(qtype):
    """simd.row_dot's target-independent IR (hosts without AVX-512 VNNI) against the reference."""
    kind = {T.Q8_0: 0, T.Q4_0: 1, T.Q4_1: 2, T.Q5_0: 3, T.Q5_1: 4}[qtype]
    w = random_qtensor(qtype, 5, 96, seed=6)
    x = activations(2, 96, seed=7)
    xq, xd, xs = quantize_activations(x)
    saved = simd.USE_VNNI
    try:
        simd.USE_VNNI = False

        @nb.njit(cache=False)
        def gemv(w, xq, xd, xs, y):
            for r in range(w.shape[0]):
                for t in range(xq.shape[0]):
                    y[t, r] = simd._row_dot(w[r], kind, xq[t], xd[t], xs[t])

        y = np.zeros((2, 5), np.float32)
        gemv(w.rows(), xq, xd, xs, y)
    finally:
        simd.USE_VNNI = saved
    assert "vpdpbusd" not in gemv.inspect_asm(gemv.signatures[0])
    assert rel_err(y, x @ reference_dequantize(w).T) <= REL_BOUND[qtype]
    np.testing.assert_allclose(y, mm.matmul(w, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_vnni", [False, True] if simd.USE_VNNI else [False])
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_1, T.Q5_0], ids=lambda t: t.name)
def test_row_tile_dot_raw_both_paths(qtype, use_vnni):
    """The in-register block decoders of the gemm tile dot, on each codegen path, vs the reference."""
    kind = {T.Q8_0: 0, T.Q4_1: 2, T.Q5_0: 3}[qtype]
    m, k, n = 3, 96, 16
    w = random_qtensor(qtype, m, k, seed=8)
    x = activations(n, k, seed=9)
    qx = quantize_activations(x)
    nblk = k // 32
    xi = np.empty((1, nblk * 512), np.int8)
    xdt = np.empty((1, nblk * 16), np.float32)
    xst = np.empty((1, nblk * 16), np.float32)
    matmul_legacy._prepare_tiles(*qx, 0, 1, xi, xdt, xst)
    saved = simd.USE_VNNI
    try:
        simd.USE_VNNI = use_vnni

        @nb.njit(cache=False)
        def tile(w, xi, xdt, xst, y):
            out = np.empty(16, np.float32)
            for r in range(w.shape[0]):
                simd._row_tile_dot_raw(w[r], kind, xi, xdt, xst, out)
                y[:, r] = out

        y = np.zeros((n, m), np.float32)
        tile(w.rows(), xi[0], xdt[0], xst[0], y)
    finally:
        simd.USE_VNNI = saved
    assert ("vpdpbusd" in tile.inspect_asm(tile.signatures[0])) == use_vnni
    assert rel_err(y, x @ reference_dequantize(w).T) <= REL_BOUND[qtype]
