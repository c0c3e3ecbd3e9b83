"""IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ3_S matmul kernels (backends/cpu/matmul_iqgrid.py) vs
x @ dequantize(W).T in float64 (gguf-py's dequantizer as ground truth).

Bounds, per (token t, row r), with W the dequantized weights and xd·xq the q8_32 activations:
- the kernels' only approximation is the int8 activation rounding, |x_j - xd_b·xq_j| <= xd_b / 2
  per element, so |y - x·W_r| <= ½ Σ_j xd_b(j)·|W_rj| (+ float32 slack); in norm that is
  ~0.4-1% on random data (REL_ERR 1.5%, as the K-quants);
- against the product of the *quantized* activations the integer dots are exact and only float32
  rounding is left: relative error <= 1e-5 (measured ~2e-7).
Batch invariance: gemv and gemm give each token bit-identical rows whatever n and tile.
"""

import edged  # noqa: F401  (numba settings before numba is imported)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import matmul_iqgrid as mi
from edged.backends.cpu.act_quant import quantize_activations
from tests.helpers.qdata import random_qtensor, reference_dequantize

TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S]
REL_ERR = 0.015  # vs the float64 product with the float activations (the q8 rounding)
REL_ERR_Q8 = 1e-5  # vs the float64 product with the quantized activations (float32 rounding only)


def _run(kernel, w, x):
    xq, xd, xs = quantize_activations(x)
    y = np.full((x.shape[0], w.n_rows), np.nan, dtype=np.float32)  # [n, m]; NaN shows unwritten
    kernel(w.rows(), xq, xd, xs, y)
    return y


def _rel_err(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def _check_bounds(name, y, w, x):
    """The module docstring's three bounds for y = kernel(w, x)."""
    wf = reference_dequantize(w).astype(np.float64)  # [m, k]
    n, k = x.shape
    xq, xd, _ = quantize_activations(x)
    xd_e = np.repeat(xd.astype(np.float64), 32, axis=1)  # [n, k] each element's activation scale
    ref = x.astype(np.float64) @ wf.T  # [n, m]
    ref_q8 = (xq * xd_e) @ wf.T  # [n, m]
    assert np.isfinite(y).all(), f"{name} left outputs unwritten"
    bound = 0.5 * xd_e @ np.abs(wf).T + 1e-5 * np.abs(x.astype(np.float64)) @ np.abs(wf).T  # [n, m]
    worst = float(np.max(np.abs(y - ref) - bound))
    assert worst <= 0, f"{name}: an element exceeds the q8 rounding bound by {worst:.3g}"
    err = _rel_err(y, ref)
    assert err < REL_ERR, f"{name}: rel err {err:.4f} vs the float activations"
    err_q8 = _rel_err(y, ref_q8)
    assert err_q8 < REL_ERR_Q8, f"{name}: rel err {err_q8:.2e} vs the quantized activations"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k,m", [(256, 7), (512, 33)])
def test_kernels_within_bounds(qtype, k, m):
    """gemv and gemm over one and two superblocks, odd m, n in {1, 3, 17}; gemv == gemm."""
    w = random_qtensor(qtype, m, k, seed=k + m)
    rng = np.random.default_rng(k)
    gemv, gemm = mi.KERNELS[qtype]
    for n in (1, 3, 17):
        x = rng.standard_normal((n, k)).astype(np.float32)  # [n, k]
        x[:, :32] *= 30.0  # blocks of very different activation scales
        y_gemv, y_gemm = _run(gemv, w, x), _run(gemm, w, x)
        _check_bounds(f"gemv {qtype.name} n={n} k={k}", y_gemv, w, x)
        _check_bounds(f"gemm {qtype.name} n={n} k={k}", y_gemm, w, x)
        np.testing.assert_array_equal(y_gemv, y_gemm, err_msg=f"{qtype.name} n={n}: gemv and gemm differ")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_extreme_blocks(qtype):
    """Every quant byte 0xFF (the last grid rows, every sign negative, sub-scales 15, high index
    bits set) or 0x00 (grid row 0, no signs, sub-scale 0), with positive and negative d."""
    w = random_qtensor(qtype, 6, 512, seed=2)
    blocks = w.data.reshape(12, -1)  # 12 superblocks, d in bytes 0-1
    blocks[0::2, 2:] = 0xFF
    blocks[1::2, 2:] = 0x00
    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    for kern in mi.KERNELS[qtype]:
        _check_bounds(f"{kern.__name__} extreme", _run(kern, w, x), w, x)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_batch_size_gives_identical_rows(qtype):
    """Each token alone (gemv, n = 1) equals its row in gemv at n = 2..5 and in gemm at n = 2..17
    (8-token tiles up to 8, 16-token tiles and a partial one after): batch invariance."""
    w = random_qtensor(qtype, 9, 512, seed=6)
    x = np.random.default_rng(7).standard_normal((17, 512)).astype(np.float32)  # [17, k]
    gemv, gemm = mi.KERNELS[qtype]
    alone = np.concatenate([_run(gemv, w, x[t : t + 1]) for t in range(17)])  # [17, m]
    for n in range(2, 6):
        np.testing.assert_array_equal(_run(gemv, w, x[:n]), alone[:n], err_msg=f"gemv n={n}")
    for n in (2, 5, 8, 9, 16, 17):
        np.testing.assert_array_equal(_run(gemm, w, x[:n]), alone[:n], err_msg=f"gemm n={n}")


def test_gemm_two_passes_and_partial_tiles():
    """n = 130 at k = 2048: two passes over the weights (128 tokens each, the second a 2-token
    tile), m = 7 a partial group of rows; each token still equals gemv's row."""
    x = np.random.default_rng(5).standard_normal((130, 2048)).astype(np.float32)
    for qtype in TYPES:
        w = random_qtensor(qtype, 7, 2048, seed=3)
        gemv, gemm = mi.KERNELS[qtype]
        y = _run(gemm, w, x)
        _check_bounds(f"gemm {qtype.name} n=130", y, w, x)
        np.testing.assert_array_equal(y, _run(gemv, w, x), err_msg=f"{qtype.name}: gemm and gemv differ")


def test_matmul_dispatches_the_types():
    """matmul() runs these types through this module's kernels (gemv alone, gemm batched), and a
    token's row is the same either way."""
    from edged.backends.cpu.matmul import gemv_max_n, kernels_for, matmul

    for qtype in TYPES:
        assert kernels_for(qtype) == mi.KERNELS[qtype]
        w = random_qtensor(qtype, 37, 512, seed=3)
        x = np.random.default_rng(4).standard_normal((gemv_max_n(qtype) + 19, 512)).astype(np.float32)
        batched = matmul(w, x)  # gemm
        for t in (0, 7, x.shape[0] - 1):
            np.testing.assert_array_equal(matmul(w, x[t : t + 1])[0], batched[t], err_msg=qtype.name)
