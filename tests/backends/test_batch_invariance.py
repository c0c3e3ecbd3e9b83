"""A token's matmul output must not depend on the batch it is in: gemv (small n) and gemm (large n)
give bit-identical rows, so greedy decoding alone equals decoding inside any batch."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.matmul import GEMV_MAX_N, matmul
from tests.helpers.qdata import random_qtensor

TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
         T.IQ4_XS, T.F32, T.F16, T.BF16]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_rows_identical_alone_and_in_a_batch(qtype):
    k = 512
    w = random_qtensor(qtype, 37, k, seed=3)
    x = np.random.default_rng(4).standard_normal((GEMV_MAX_N + 19, k)).astype(np.float32)
    batched = matmul(w, x)  # gemm path
    for t in (0, 7, x.shape[0] - 1):
        alone = matmul(w, x[t : t + 1])  # gemv path
        np.testing.assert_array_equal(alone[0], batched[t])
