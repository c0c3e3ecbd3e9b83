"""Activation quantization: the default per-32 grid and llama.cpp's Q8_K grid (per 256)."""

import edged  # noqa: F401  (numba settings before numba is imported)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.act_quant import quantize_activations
from edged.backends.cpu.matmul import matmul
from tests.helpers.qdata import random_qtensor, reference_dequantize
from tests.helpers.ggml_quant import quant_q8_K


def _x(n, k, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[:, 7] = 30.0  # a positive outlier (q = -127 on llama.cpp's grid) ...
    x[:, k - 3] = -50.0  # ... and a negative one in the last superblock
    if n > 1:
        x[1, :256] = 0.0  # an all-zero superblock
    return x


def _values(qx):
    xq, xd, _ = qx
    n, k = xq.shape
    return xq.reshape(n, k // 32, 32).astype(np.float64) * xd[..., None].astype(np.float64)


def test_q8_32_grid():
    """Per 32: d = amax/127, q = rint(x/d), block sums; within half a step of x."""
    x = _x(3, 512)
    xq, xd, xs = quantize_activations(x)
    xb = x.reshape(3, 16, 32)
    np.testing.assert_array_equal(xd, np.abs(xb).max(-1) / np.float32(127))
    np.testing.assert_array_equal(xs, xq.reshape(3, 16, 32).astype(np.int32).sum(-1))
    assert np.all(np.abs(_values((xq, xd, xs)) - xb) <= xd[..., None] * 0.5 + 1e-6)


def test_q8_K_grid_equals_llamacpp_formula():
    """Per 256: the same int8 values and scale as quantize_row_q8_K_ref (as emulated), the scale
    repeated over the 8 per-32 entries, per-32 sums of the ints; a zero superblock stays zero."""
    x = _x(3, 512, seed=1)
    xq, xd, xs = quantize_activations(x, grid="q8_K")
    np.testing.assert_array_equal(_values((xq, xd, xs)).reshape(3, 512), quant_q8_K(x))
    assert np.all(xd.reshape(3, 2, 8) == xd.reshape(3, 2, 8)[..., :1])
    np.testing.assert_array_equal(xs, xq.reshape(3, 16, 32).astype(np.int32).sum(-1))
    assert xq[0, 7] == -127 and xq[0, 509] == -127  # the max maps to -127 whatever its sign
    assert np.all(xq[1, :256] == 0) and np.all(xd[1, :8] == 0)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K])
@pytest.mark.parametrize("n", [1, 6])
def test_kquant_matmul_on_q8_K_grid(qtype, n):
    """A K-quant kernel fed the Q8_K grid computes dequant(W) @ (Q8_K-rounded x)."""
    w = random_qtensor(qtype, 16, 512, seed=3)
    x = _x(n, 512, seed=n)
    y = matmul(w, x, qx=quantize_activations(x, grid="q8_K"))
    ref = quant_q8_K(x) @ reference_dequantize(w).astype(np.float64).T
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_bad_input():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_activations(np.zeros((1, 96), np.float32), grid="q8_K")
    with pytest.raises(ValueError, match="unknown activation grid"):
        quantize_activations(np.zeros((1, 64), np.float32), grid="q4")
    with pytest.raises(ValueError, match=r"\[n, k\]"):
        quantize_activations(np.zeros(64, np.float32))


def test_one_row_serial_equals_batched():
    """A single row (quantized in the calling thread) gives the bits the batched kernel gives."""
    x = _x(5, 640, seed=3)
    x[2, 40:72] = -0.0  # an all-zero block: d = 0, q = 0
    batched = quantize_activations(x)
    for r in range(5):
        one = quantize_activations(x[r : r + 1])
        for a, b in zip(one, batched):
            np.testing.assert_array_equal(a[0], b[r])
