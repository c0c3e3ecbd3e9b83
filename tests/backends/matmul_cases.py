"""Shared pieces of the matmul tests: random activations and the bound against gguf-py's
dequantized weights (float64 product)."""

import numpy as np

from tests.helpers.qdata import random_qtensor, reference_dequantize


def activations(n, k, seed):
    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)  # [n, k]


def rel_err(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def check_close_to_dequantized(matmul, qtype, k, ms, ns, bound):
    """||matmul(w, x) - x @ W.T|| / ||x @ W.T|| <= bound for random w [m, k] and x [n, k]."""
    for m in ms:
        w = random_qtensor(qtype, m, k, seed=k + m)
        wf = reference_dequantize(w).astype(np.float64)  # [m, k]
        for n in ns:
            x = activations(n, k, seed=n)
            y = matmul(w, x)
            assert y.shape == (n, m) and y.dtype == np.float32
            err = rel_err(y, x.astype(np.float64) @ wf.T)
            assert err <= bound, f"{qtype.name} m={m} k={k} n={n}: rel err {err:.2e}"
