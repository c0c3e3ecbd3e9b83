"""moe_combine: a mixture-of-experts layer's output, each token's expert rows weighted and summed.

The experts' outputs come grouped by expert (every token routed to expert e in one matmul); this
op puts them back per token. A token's terms are added in the order of its own choices (rank 0
first, as llama.cpp adds them), never in the order of the groups, so its bits do not depend on
which other tokens share the batch.
"""

import numba as nb
import numpy as np

from edged.backends.cpu.kernel_threads import runs_serial


@nb.njit(nogil=True, cache=True, inline="always")
def _combine(y, src, w, out):
    n, c = src.shape
    d = y.shape[1]
    for t in nb.prange(n):
        for i in range(d):
            out[t, i] = np.float32(0.0)
        for j in range(c):  # the token's terms in its own order
            r = src[t, j]
            wt = w[t, j]
            for i in range(d):
                out[t, i] += wt * y[r, i]


@nb.njit(parallel=True, nogil=True, cache=True)
def _combine_rows(y, src, w, out):
    _combine(y, src, w, out)


@nb.njit(nogil=True, cache=True)
def _combine_rows_serial(y, src, w, out):
    _combine(y, src, w, out)


def moe_combine(ys, src: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """out float32 [n, d]: out[t] = sum over j = 0, 1, ... of weights[t, j] * Y[src[t, j]], where Y
    is the rows of the arrays `ys` (each float32 [m_i, d]) concatenated; src int32 [n, c],
    weights float32 [n, c]."""
    y = ys[0] if len(ys) == 1 else np.concatenate(ys)  # [sum m_i, d]
    y = np.ascontiguousarray(y, dtype=np.float32)
    src = np.ascontiguousarray(src, dtype=np.int32)
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    if y.ndim != 2 or src.ndim != 2 or weights.shape != src.shape:
        raise ValueError(f"moe_combine: rows {y.shape}, src {src.shape} and weights {weights.shape} "
                         "must be [m, d], [n, c] and [n, c]")
    if src.size and (src.min() < 0 or src.max() >= y.shape[0]):
        raise ValueError(f"moe_combine: src indices must be in [0, {y.shape[0]})")
    out = np.empty((src.shape[0], y.shape[1]), dtype=np.float32)
    (_combine_rows_serial if runs_serial(out) else _combine_rows)(y, src, weights, out)
    return out
