"""Activation quantization shared by every integer matmul kernel: x float32 [n, k] becomes int8
blocks of 32 with one f32 scale and the int32 sum of each block (llama.cpp's Q8_0-style vec_dot_type;
per-32 scales keep ~1% error vs ~2% for per-256)."""

import numba as nb
import numpy as np

QK = 32  # activation block length


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=False)
def quantize_rows_q8(x, xq, xd, xs):
    """x float32 [n, k] -> xq int8 [n, k], xd float32 [n, k//32] scales, xs int32 [n, k//32] sums."""
    n, k = x.shape
    nb_ = k // QK
    for t in nb.prange(n * nb_):
        r = t // nb_
        b = t % nb_
        base = b * QK
        amax = np.float32(0.0)
        for j in range(QK):
            v = abs(x[r, base + j])
            if v > amax:
                amax = v
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
        s = np.int32(0)
        for j in range(QK):
            q = np.int32(np.rint(x[r, base + j] * inv))
            xq[r, base + j] = np.int8(q)
            s = np.int32(s + q)
        xd[r, b] = d
        xs[r, b] = s


def quantize_activations(x: np.ndarray):
    """Quantize float32 activations [n, k] (k a multiple of 32) -> (xq, xd, xs)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = x.shape
    if k % QK:
        raise ValueError(f"activation width {k} is not a multiple of {QK}")
    xq = np.empty((n, k), dtype=np.int8)  # [n, k]
    xd = np.empty((n, k // QK), dtype=np.float32)  # [n, k/32]
    xs = np.empty((n, k // QK), dtype=np.int32)  # [n, k/32]
    quantize_rows_q8(x, xq, xd, xs)
    return xq, xd, xs
