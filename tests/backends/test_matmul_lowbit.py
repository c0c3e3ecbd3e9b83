"""IQ1_S / IQ1_M / TQ1_0 / TQ2_0 / MXFP4 matmul kernels vs float64 x @ dequantize(W).T (gguf-py's
dequantizer as ground truth), and batch invariance.

Run: .venv/bin/python -m pytest tests/backends/test_matmul_lowbit.py -q (add -m slow for the VNNI /
portable-path check)."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import matmul_lowbit as ml
from edged.backends.cpu.act_quant import quantize_activations
from edged.quant.synth import set_f16_scale
from tests.backends.matmul_cases import activations, rel_err
from tests.helpers.qdata import random_qtensor, reference_dequantize

mm = sys.modules["edged.backends.cpu.matmul"]

# ||y - ref|| / ||ref|| bounds. The only approximation is the int8 per-32 activation quantization
# (~0.5-1% on random data; worst seen over 6 seeds of these shapes: IQ1_S 0.74%, IQ1_M 0.92%,
# TQ1_0 1.3%, TQ2_0 0.96%, MXFP4 0.69%); the weights' own products are exact in the integer dots
# (against the dequantized activations the kernels agree to ~2e-7, float32 rounding).
REL_ERR = {T.IQ1_S: 0.02, T.IQ1_M: 0.02, T.TQ1_0: 0.02, T.TQ2_0: 0.02, T.MXFP4: 0.015}
TYPES = list(ml.KERNELS)


def _run(kernel, w, x):
    xq, xd, xs = quantize_activations(x)
    y = np.full((x.shape[0], w.n_rows), np.nan, dtype=np.float32)  # [n, m]; NaN shows unwritten
    kernel(w.rows(), xq, xd, xs, y)
    return y


def _shapes(qtype):
    # MXFP4 (32-element blocks) also where a row ends inside a 256-element unit: k = 288 (one
    # block past it) and gpt-oss's k = 2880 (11 units and 2 blocks)
    return [(256, 7), (512, 33)] + ([(288, 5), (2880, 9)] if qtype == T.MXFP4 else [])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_kernels_match_reference(qtype):
    """gemv and gemm at n = 1, 3, 17 on one and two superblocks with odd m, within REL_ERR of the
    float64 product; against the dequantized int8 activations, to float32 rounding."""
    gemv, gemm = ml.KERNELS[qtype]
    for k, m in _shapes(qtype):
        w = random_qtensor(qtype, m, k, seed=k + m)
        wf = reference_dequantize(w).astype(np.float64)  # [m, k]
        x = activations(17, k, seed=k)  # [17, k]
        xq, xd, _ = quantize_activations(x)
        xdq = (xq.reshape(17, -1, 32) * xd[:, :, None].astype(np.float64)).reshape(17, k)  # what the kernels see
        for n in (1, 3, 17):
            ref = x[:n].astype(np.float64) @ wf.T  # [n, m]
            exact = xdq[:n] @ wf.T
            for kern in (gemv, gemm):
                y = _run(kern, w, x[:n])
                assert np.isfinite(y).all(), f"{kern.__name__} left outputs unwritten"
                err = rel_err(y, ref)
                assert err < REL_ERR[qtype], f"{kern.__name__} n={n} k={k} m={m}: rel err {err:.4f}"
                assert np.abs(y - exact).max() <= 1e-6 * np.abs(exact).max(), f"{kern.__name__} n={n} k={k}"


def _edge_blocks(qtype, w):
    """Blocks at the limits of each field (in place), every one a valid encoding of its type."""
    tt = mm.traits(qtype)
    b = w.data.reshape(-1, tt.type_size)
    if qtype == T.IQ1_S:
        b[0::2, 2:34] = 0xFF  # grid row 2047 (with qh's high bits 7) ...
        b[0::2, 34:50] = 0xFF  # ... scale 7, delta -1/8
        b[1::2, 34:50] = 0x00  # grid rows 0..255, scale 0 (dl = d), delta +1/8
    elif qtype == T.IQ1_M:
        b[0::2, 0:48] = 0xFF  # grid row 2047, delta -1/8
        b[0::2, 48:56] = 0xFF  # every 3-bit scale 7 (d is their top nibbles: re-set below)
        b[1::2, 32:48] = 0x00  # rows 0..255, delta +1/8
    elif qtype == T.TQ1_0:
        b[0::2, 0:52] = 255  # how 22222 in base 3 is stored (q·256/243 rounded up): all trits +1
        b[1::2, 0:52] = 0  # all trits -1
    elif qtype == T.TQ2_0:
        b[0::2, 0:64] = 0xAA  # all 2: +1
        b[1::2, 0:64] = 0x00  # all -1
    else:  # MXFP4: the largest-magnitude values (±6, doubled ±12); per pair of rows an exponent
        b[:, 1:17] = np.array([0x77, 0xFF, 0x7F, 0xF7], np.uint8)[np.arange(16) % 4]
        e = b.reshape(w.n_rows, -1, tt.type_size)[:, :, 0]  # [m, blocks per row]
        e[0:2], e[2:4], e[4:6] = 0, 1, 140  # 2^-128 and 2^-127 (float32 subnormals: e < 2), 2^12
    if qtype == T.IQ1_M:  # restore a finite d in the scales' top nibbles
        set_f16_scale(qtype, b, np.full(len(b), np.float16(0.01)).view(np.uint16))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_edge_blocks(qtype):
    """Largest grid rows and scales, both delta signs, all-plus and all-minus trits, MXFP4's largest
    values with subnormal and large exponents: exact up to the activation rounding."""
    k = 512
    w = random_qtensor(qtype, 6, k, seed=2)
    _edge_blocks(qtype, w)
    wf = reference_dequantize(w).astype(np.float64)
    assert np.isfinite(wf).all()
    x = activations(17, k, seed=3)
    xq, xd, _ = quantize_activations(x)
    exact = (xq.reshape(17, -1, 32) * xd[:, :, None].astype(np.float64)).reshape(17, k) @ wf.T
    # each row at its own magnitude; MXFP4's subnormal-scale rows (0-3) lose bits where xd · 2^-128
    # underflows (so does llama.cpp's float32 d · xd), far from what a wrong exponent would give
    tol = np.full(w.n_rows, 1e-6)
    normal = slice(None)  # rows compared with the float64 product
    if qtype == T.MXFP4:
        tol[:4], normal = 1e-3, slice(4, None)
    for kern in ml.KERNELS[qtype]:
        y = _run(kern, w, x)
        assert (np.abs(y - exact) <= tol * np.abs(exact).max(axis=0)).all(), f"{kern.__name__}"
        assert rel_err(y[:, normal], x.astype(np.float64) @ wf[normal].T) < REL_ERR[qtype], f"{kern.__name__}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_batch_size_gives_identical_rows(qtype):
    """gemv at n = 1..7 (token groups of 4, 2 and 1 sharing each unpacked superblock) and gemm at
    n = 2..17 (8- and 16-token tiles, a partial one) give each token bit-identical outputs, odd m;
    matmul itself (gemv up to gemv_max_n, gemm above) likewise."""
    k = 2880 if qtype == T.MXFP4 else 512
    w = random_qtensor(qtype, 9, k, seed=6)
    x = activations(17, k, seed=7)  # [17, k]
    gemv, gemm = ml.KERNELS[qtype]
    alone = np.concatenate([_run(gemv, w, x[t : t + 1]) for t in range(17)])  # [17, m]
    for n in range(2, 8):
        np.testing.assert_array_equal(_run(gemv, w, x[:n]), alone[:n], err_msg=f"gemv n={n}")
    for n in (2, 5, 8, 9, 16, 17):
        np.testing.assert_array_equal(_run(gemm, w, x[:n]), alone[:n], err_msg=f"gemm n={n}")
    assert mm.gemv_max_n(qtype) < 17
    np.testing.assert_array_equal(mm.matmul(w, x), alone, err_msg="matmul n=17")
    np.testing.assert_array_equal(mm.matmul(w, x[4:5]), alone[4:5], err_msg="matmul n=1")


def test_gemm_multiple_passes():
    """MXFP4 at k = 2880 takes 80 tokens per pass over the weights: n = 130 is two passes and a
    2-token tile, each token as it is alone."""
    w = random_qtensor(T.MXFP4, 5, 2880, seed=8)
    x = activations(130, 2880, seed=9)
    gemv, gemm = ml.KERNELS[T.MXFP4]
    y = _run(gemm, w, x)
    for t in (0, 79, 80, 129):
        np.testing.assert_array_equal(y[t], _run(gemv, w, x[t : t + 1])[0], err_msg=f"token {t}")
    assert rel_err(y, x.astype(np.float64) @ reference_dequantize(w).astype(np.float64).T) < REL_ERR[T.MXFP4]


def _tiled_gemm(rows_kernel, kind, w, x, tw=16):
    """y = x @ W.T (one pass over the weights) through matmul_lowbit's steps with the given
    _gemm_rows copy."""
    nsb, tail = ml._split_row(kind, w.rows().shape[1])
    xq, xd, xs = ml._pad_units(*quantize_activations(x), nsb + (1 if tail else 0))
    n, k = xq.shape
    s16 = kind == ml.KIND_IQ1M
    ntile = (n + tw - 1) // tw
    xi = np.empty((ntile, k * tw), np.int8)
    xdt = np.empty((ntile, k // 32 * tw), np.float32)
    xbt = np.empty((ntile, (2 if s16 else 1) * k // 32 * tw), np.float32)
    ml._prepare_tiles(xq, xd, xs, 0, tw, s16, ml.IQ1M_BIAS if s16 else 0, xi, xdt, xbt)
    y = np.full((n, w.n_rows), np.nan, np.float32)
    rows_kernel(kind, tw, w.rows(), 0, n, xi, xdt, xbt, y)
    return y


@pytest.mark.slow
@pytest.mark.parametrize("use_vnni", [True, False], ids=["vnni", "portable"])
def test_vector_paths(use_vnni):
    """With VNNI (on hosts that have it) the hot loops are vpdpbusd; the portable vector code (hosts
    without VNNI or F16C) gives the same bits and no vpdpbusd. Fresh uncached copies, so the flags
    are read at their compile."""
    import numba as nb

    from edged.backends.cpu import vector_ir

    if use_vnni and not vector_ir.USE_VNNI:
        pytest.skip("host has no AVX-512 VNNI")
    saved = vector_ir.USE_VNNI, vector_ir.USE_F16C
    vector_ir.USE_VNNI = use_vnni
    vector_ir.USE_F16C = saved[1] and use_vnni
    try:
        gemv = nb.njit(parallel=True, nogil=True)(ml.gemv_lowbit.py_func)
        rows = nb.njit(parallel=True, nogil=True)(ml._gemm_rows.py_func)  # the gemm's IR is in its row loop
        for qtype, (kg, _) in ml.KERNELS.items():
            kind = kg.extra[0]
            k = 288 if qtype == T.MXFP4 else 256
            w = random_qtensor(qtype, 7, k, seed=9)
            x = activations(17, k, seed=10)
            want = np.concatenate([_run(ml.KERNELS[qtype][0], w, x[t : t + 1]) for t in range(17)])
            np.testing.assert_array_equal(_run(lambda *a: gemv(*a, kind), w, x[:3]), want[:3], err_msg=qtype.name)
            np.testing.assert_array_equal(_tiled_gemm(rows, kind, w, x), want, err_msg=qtype.name)
        assert ("vpdpbusd" in gemv.inspect_asm(gemv.signatures[0])) == use_vnni
        assert ("vpdpbusd" in rows.inspect_asm(rows.signatures[0])) == use_vnni
    finally:
        vector_ir.USE_VNNI, vector_ir.USE_F16C = saved
