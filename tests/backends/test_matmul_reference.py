"""Every fast matmul kernel against the plain numpy reference of what it computes
(backends/cpu/matmul_reference.py), bit for bit: the activation quantization, the exact int32
block dots and the float epilogue in the kernels' own order. Both kernels of every type (gemv and
gemm, called directly) at n = 1 and batched, rows and k with partial tiles and groups. The
decoders of the reference are checked against gguf-py's dequantizer first, so the reference does
not just restate the kernels' reading of the formats."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import matmul_reference as ref
from edged.backends.cpu.act_quant import quantize_activations
from tests.helpers.qdata import random_qtensor, reference_dequantize

mm = sys.modules["edged.backends.cpu.matmul"]

LEGACY = list(ref.LEGACY)
KQUANTS = list(ref.KQUANTS)
FLOATS = [T.F32, T.F16, T.BF16]
NS = [1, 2, 5, 16, 17]
# (m, k): odd m leaves partial row tiles and groups; legacy k = 640 / 896 end in a half group of
# 8 blocks (its own compiled path), 96 in a partial one; float k = 100 / 17 end in a partial slice
SHAPES = {
    "legacy": [(7, 640), (33, 896), (5, 96), (9, 2048)],
    "kquant": [(7, 256), (33, 768), (9, 2048)],
    "float": [(7, 100), (13, 640), (5, 17)],
}


def _x(n, k, seed):
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)  # [n, k]
    x[:, :32] *= 40.0  # blocks of very different scales
    return x


def _family(qtype):
    return "legacy" if qtype in LEGACY else "kquant" if qtype in KQUANTS else "float"


@pytest.mark.parametrize("grid", ["q8_32", "q8_K"])
def test_activation_quantization_exact(grid):
    for n, k in ((1, 256), (5, 768), (17, 2048)):
        x = _x(n, k, k)
        x[0, 256 - 32 :] = 0.0  # an all-zero block: d = 0
        want = ref.quantize_q8_K(x) if grid == "q8_K" else ref.quantize_q8_32(x)
        for a, b in zip(quantize_activations(x, grid=grid), want):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"{grid} n={n} k={k}"


@pytest.mark.parametrize("qtype", LEGACY + KQUANTS, ids=lambda t: t.name)
def test_reference_decoders_match_gguf(qtype):
    """s·u + c of the reference decoders is gguf-py's dequantized weight (float32 rounding of
    the product only)."""
    w = random_qtensor(qtype, 9, 512, seed=1)
    want = reference_dequantize(w).astype(np.float64)
    np.testing.assert_allclose(ref.dequantize(w), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def _shapes_and_types():
    for qtype in LEGACY + KQUANTS + FLOATS:
        for m, k in SHAPES[_family(qtype)]:
            yield pytest.param(qtype, m, k, id=f"{qtype.name}-{m}x{k}")


@pytest.mark.parametrize("qtype,m,k", list(_shapes_and_types()))
def test_kernels_equal_reference(qtype, m, k):
    """gemv and gemm (both, whatever n matmul would give them) and matmul itself equal the
    reference exactly for n in NS."""
    w = random_qtensor(qtype, m, k, seed=k + m)
    gemv, gemm = mm.kernels_for(qtype)
    for n in NS:
        x = _x(n, k, n + k)
        want = ref.matmul_reference(w, x)
        assert np.array_equal(mm.matmul(w, x), want), f"matmul n={n}"
        for kern in (gemv, gemm):
            y = np.full((n, m), np.nan, np.float32)  # [n, m]
            if qtype in FLOATS:
                kern(w.rows(), x, y)
            else:
                kern(w.rows(), *quantize_activations(x), y)
            np.testing.assert_array_equal(y, want, err_msg=f"{kern.__name__} n={n}")


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
def test_kquants_on_q8K_activations(qtype):
    """Fed llama.cpp's Q8_K activation grid, the K-quant kernels still equal the reference."""
    w = random_qtensor(qtype, 7, 512, seed=3)
    for n in (1, 17):
        x = _x(n, 512, n)
        qx = quantize_activations(x, grid="q8_K")
        for kern in mm.kernels_for(qtype):
            y = np.empty((n, 7), np.float32)
            kern(w.rows(), *qx, y)
            np.testing.assert_array_equal(y, ref.matmul_reference(w, x, qx=qx), err_msg=kern.__name__)


def test_block_dots_are_the_integer_dot():
    """The reference's int32 block dot is Σ u·xq in exact integers (u8 × i8, 32 products)."""
    u = np.full((1, 1, 32), 255, np.uint8)
    xq = np.full((1, 32), -128, np.int8)
    assert ref.block_dots(u, xq)[0, 0, 0] == 32 * 255 * -128
    assert ref.block_dots(u, xq, 16).tolist() == [[[16 * 255 * -128] * 2]]
