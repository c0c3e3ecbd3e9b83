"""Float-weight kernels (F32, F16, BF16) against gguf-py's dequantize + numpy in float64."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.helpers.qdata import random_qtensor, reference_dequantize

mm = sys.modules["edged.backends.cpu.matmul"]

# ||y - y_ref|| / ||y_ref|| against a float64 product: the weights widen exactly, so only float32
# accumulation rounding remains (measured <= 1e-7 up to k = 2048); 1e-6 for every float type.
REL_BOUND = {T.F32: 1e-6, T.F16: 1e-6, T.BF16: 1e-6}
TYPES = list(REL_BOUND)
KS = [32, 64, 96, 640, 2048]
MS = [7, 33]
NS = [1, 3, 17, 64]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_matches_reference(qtype, k):
    for m in MS:
        w = random_qtensor(qtype, m, k, seed=k + m)
        wf = reference_dequantize(w).astype(np.float64)  # [m, k]
        for n in NS:
            x = np.random.default_rng(n).standard_normal((n, k)).astype(np.float32)  # [n, k]
            y = mm.matmul(w, x)
            ref = x.astype(np.float64) @ wf.T
            err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
            assert err <= REL_BOUND[qtype], f"{qtype.name} m={m} k={k} n={n}: rel err {err:.2e}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemv_and_gemm_agree(qtype):
    m, k = 9, 96  # 9 rows: two full 4-row gemm tiles and a partial one
    w = random_qtensor(qtype, m, k, seed=2)
    gemv, gemm = mm.kernels_for(qtype)
    for n in (1, 3, 17):
        x = np.random.default_rng(n).standard_normal((n, k)).astype(np.float32)
        y1 = np.full((n, m), np.nan, np.float32)
        y2 = np.full((n, m), np.nan, np.float32)
        gemv(w.rows(), x, y1)
        gemm(w.rows(), x, y2)
        np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6)


def test_special_values_propagate():
    """F16 inf/NaN weights widen exactly (quant/f16), so they reach the output like numpy's."""
    w = random_qtensor(T.F16, 3, 32, seed=0)
    h = w.data.view(np.float16)
    h[0] = np.inf
    h[32] = np.nan
    y = mm.matmul(w, np.ones((1, 32), np.float32))
    assert np.isposinf(y[0, 0]) and np.isnan(y[0, 1]) and np.isfinite(y[0, 2])
