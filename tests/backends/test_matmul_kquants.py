"""K-quant / IQ4_XS matmul kernels vs x @ dequantize(W).T (gguf-py's dequantizer as ground truth).

Run: .venv/bin/python -m pytest tests/backends/test_matmul_kquants.py -q (add -m slow for the
VNNI / portable-path checks)."""

import edged  # noqa: F401  (numba settings before numba is imported)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import matmul_kquants as mk
from edged.backends.cpu.act_quant import quantize_activations
from tests.helpers.qdata import random_qtensor, reference_dequantize

# ||y - ref|| / ||ref|| bounds. The only approximation is the int8 per-32 activation quantization
# (~0.5-1% on random data); Q2_K/Q3_K's few weight levels make the relative error a little larger.
REL_ERR = {T.Q2_K: 0.02, T.Q3_K: 0.02, T.Q4_K: 0.015, T.Q5_K: 0.015, T.Q6_K: 0.015, T.IQ4_XS: 0.015}
TYPES = list(mk.KERNELS)


def _rel_err(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def _run(kernel, w, x):
    xq, xd, xs = quantize_activations(x)
    y = np.full((x.shape[0], w.n_rows), np.nan, dtype=np.float32)  # [n, m]; NaN shows unwritten
    kernel(w.rows(), xq, xd, xs, y)
    return y


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k,m", [(256, 7), (512, 33), (768, 7), (2048, 33)])
def test_kernels_match_reference(qtype, k, m):
    """gemv and gemm over 1-3 superblocks and a long row, odd m, n in {1, 3, 17, 64}."""
    w = random_qtensor(qtype, m, k, seed=k + m)
    wf = reference_dequantize(w)  # [m, k]
    gemv, gemm = mk.KERNELS[qtype]
    rng = np.random.default_rng(k)
    for n in (1, 3, 17, 64):
        x = rng.standard_normal((n, k)).astype(np.float32)  # [n, k]
        ref = x @ wf.T  # [n, m]
        kernels = (gemv, gemm) if n < 64 else (gemm,)  # gemv is for small n; keep CI lean
        for kern in kernels:
            y = _run(kern, w, x)
            assert np.isfinite(y).all(), f"{kern.__name__} left outputs unwritten"
            err = _rel_err(y, ref)
            assert err < REL_ERR[qtype], f"{kern.__name__} n={n} k={k} m={m}: rel err {err:.4f}"


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_extreme_subblock_scales(qtype):
    """Sub-block scales at their limits (Q3_K -32 and +31, Q6_K ±127, Q2_K 15, Q4_K 63 with the
    high bits of the 6-bit fields set) and extreme quants: the scale-unpacking, scale-folding and
    offset paths must stay exact up to activation rounding."""
    w = random_qtensor(qtype, 5, 512, seed=1)
    blocks = w.data.reshape(-1, {T.Q2_K: 84, T.Q3_K: 110, T.Q4_K: 144, T.Q6_K: 210}[qtype])
    if qtype == T.Q4_K:
        blocks[0::2, 4:16] = 0xFF  # every scale and min 63
        blocks[1::2, 4:16] = 0xC0  # pairs 0-3 zero; 4-7 mostly from the top 2 bits of bytes 0-7
        blocks[:, 16:144] = 0xF0  # low nibbles 0, high nibbles 15
    elif qtype == T.Q2_K:
        blocks[:, 0:16] = 0xFF  # scale 15, min 15
        blocks[:, 16:80] = 0xFF  # all quants 3
    elif qtype == T.Q3_K:
        blocks[0::2, 96:108] = 0x00  # every scale -32
        blocks[1::2, 96:108] = 0xFF  # every scale +31
        blocks[:, 0:32] = 0x00  # high bit 0: quant value -4 (the largest magnitude)
    else:
        blocks[0::2, 192:208] = 0x80  # scale -128
        blocks[1::2, 192:208] = 0x7F  # scale +127
        blocks[:, 0:192] = 0x00  # quant value -32
    wf = reference_dequantize(w)
    x = np.random.default_rng(2).standard_normal((17, 512)).astype(np.float32)
    ref = x @ wf.T
    for kern in mk.KERNELS[qtype]:
        err = _rel_err(_run(kern, w, x), ref)
        assert err < REL_ERR[qtype], f"{kern.__name__}: rel err {err:.4f}"


def test_gemm_multiple_passes_and_partial_tiles():
    """n = 130 at k = 2048 spans two passes over the weights (128 tokens each) and a 2-token tile;
    m = 7 leaves a partial group of rows."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((130, 2048)).astype(np.float32)
    for qtype in (T.Q4_K, T.Q6_K, T.Q5_K, T.Q3_K, T.IQ4_XS):
        w = random_qtensor(qtype, 7, 2048, seed=3)
        ref = x @ reference_dequantize(w).T
        err = _rel_err(_run(mk.KERNELS[qtype][1], w, x), ref)
        assert err < REL_ERR[qtype], f"{qtype.name}: rel err {err:.4f}"


def _fresh(fn):
    """An uncached copy of a Numba kernel: Numba cannot inspect code loaded from its on-disk cache,
    and the vector intrinsics pick VNNI or portable code when the caller is compiled."""
    import numba as nb

    return nb.njit(parallel=fn.targetoptions.get("parallel", False), nogil=True, fastmath=False)(fn.py_func)


def _tiled_gemm(rows_kernel, kind, w, x, tw=16):
    """y = x @ W.T through _prepare_tiles and the given (fresh) _gemm_rows copy; n <= 128."""
    xq, xd, xs = quantize_activations(x)
    n, k = x.shape
    ntile, nblk, nb_ = (n + tw - 1) // tw, k // 32, (1 if kind in (mk.KIND_Q4K, mk.KIND_Q5K, mk.KIND_IQ4XS) else 2)
    xi = np.empty((ntile, nblk * 32 * tw), np.int8)
    xdt = np.empty((ntile, nblk * tw), np.float32)
    xbt = np.empty((ntile, nb_ * nblk * tw), np.float32)
    mk._prepare_tiles(xq, xd, xs, 0, tw, nb_ == 2, mk._int_bias(kind), xi, xdt, xbt)
    y = np.full((n, w.n_rows), np.nan, np.float32)
    rows_kernel(kind, 0, tw, w.rows(), 0, n, xi, xdt, xbt, y)
    return y


@pytest.mark.slow
@pytest.mark.parametrize("use_vnni", [True, False], ids=["vnni", "portable"])
def test_vector_paths(use_vnni):
    """With VNNI (on hosts that have it) every kernel's hot loop is vpdpbusd; the portable vector
    code (what hosts without VNNI or F16C compile) gives the same results and no vpdpbusd."""
    from edged.backends.cpu import vector_ir

    if use_vnni and not vector_ir.USE_VNNI:
        pytest.skip("host has no AVX-512 VNNI")
    saved = vector_ir.USE_VNNI, vector_ir.USE_F16C
    vector_ir.USE_VNNI = use_vnni
    vector_ir.USE_F16C = saved[1] and use_vnni
    try:
        rng = np.random.default_rng(4)
        x = rng.standard_normal((17, 512)).astype(np.float32)
        rows_kernel = _fresh(mk._gemm_rows)
        gemv = _fresh(mk.gemv_kquant)
        for qtype, kind in ((T.Q4_K, mk.KIND_Q4K), (T.Q5_K, mk.KIND_Q5K), (T.Q6_K, mk.KIND_Q6K),
                            (T.Q3_K, mk.KIND_Q3K), (T.Q2_K, mk.KIND_Q2K), (T.IQ4_XS, mk.KIND_IQ4XS)):
            w = random_qtensor(qtype, 7, 512, seed=9)
            ref = x @ reference_dequantize(w).T
            y_gemv = _run(lambda *a: gemv(*a, kind), w, x)
            assert _rel_err(y_gemv, ref) < REL_ERR[qtype]
            for tw in (16, 8):
                y_gemm = _tiled_gemm(rows_kernel, kind, w, x, tw)
                assert _rel_err(y_gemm, ref) < REL_ERR[qtype]
                assert np.array_equal(y_gemv, y_gemm), f"{qtype.name}: gemv and {tw}-token gemm differ"
        assert ("vpdpbusd" in gemv.inspect_asm(gemv.signatures[0])) == use_vnni
        assert ("vpdpbusd" in rows_kernel.inspect_asm(rows_kernel.signatures[0])) == use_vnni
    finally:
        vector_ir.USE_VNNI, vector_ir.USE_F16C = saved


def test_real_tensors_of_default_model():
    """A real Q4_K and a real Q6_K ffn_down [640, 2048] of Gemma 3 270M Q4_K_M, n = 1 and 17."""
    from tests.helpers.model import default_model_path
    from edged.quant.gguf import load_gguf

    path = default_model_path()
    gf = load_gguf(path)
    found = {}
    for t in gf.tensors.values():
        if t.qtype in (T.Q4_K, T.Q6_K) and t.qtype not in found and "ffn_down" in t.name:
            found[t.qtype] = t
    assert set(found) == {T.Q4_K, T.Q6_K}
    rng = np.random.default_rng(0)
    for qtype, w in found.items():
        wf = reference_dequantize(w)
        x = rng.standard_normal((17, w.n_cols)).astype(np.float32)
        ref = x @ wf.T
        gemv, gemm = mk.KERNELS[qtype]
        assert _rel_err(_run(gemv, w, x[:1]), ref[:1]) < REL_ERR[qtype]
        assert _rel_err(_run(gemm, w, x), ref) < REL_ERR[qtype]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_batch_size_gives_identical_rows(qtype):
    """gemv at n = 1..7 (token groups of 4, 2 and 1 sharing each unpacked superblock) and gemm at
    n = 5 and 17 give each token bit-identical outputs (batch invariance), odd m included."""
    w = random_qtensor(qtype, 9, 512, seed=6)
    x = np.random.default_rng(7).standard_normal((17, 512)).astype(np.float32)  # [17, k]
    gemv, gemm = mk.KERNELS[qtype]
    alone = np.concatenate([_run(gemv, w, x[t : t + 1]) for t in range(17)])  # [17, m]
    for n in range(2, 8):
        np.testing.assert_array_equal(_run(gemv, w, x[:n]), alone[:n], err_msg=f"gemv n={n}")
    for n in (2, 5, 8, 9, 16, 17):  # 8-token tiles (n <= 8), 16-token tiles, a partial tile
        np.testing.assert_array_equal(_run(gemm, w, x[:n]), alone[:n], err_msg=f"gemm n={n}")
