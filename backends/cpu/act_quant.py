"""Activation quantization shared by every integer matmul kernel: x float32 [n, k] becomes int8
blocks of 32 with one f32 scale and the int32 sum of each block (llama.cpp's Q8_0-style vec_dot_type;
per-32 scales keep ~1% error vs ~2% for per-256).

grid="q8_K" gives, in the same per-32 layout, llama.cpp's Q8_K grid (its vec_dot_type for the
K-quants): one scale per 256 values, iscale = -127/max (max = the value of largest magnitude),
q = min(127, rne(x * iscale)), d = 1/iscale, repeated in the 8 per-32 entries of xd. A K-quant
kernel fed this computes llama.cpp's integer dot exactly (only its float summation order differs).
"""

import numba as nb
import numpy as np

from edged.backends.cpu.kernel_threads import SERIAL_ELEMENTS, runs_serial

QK = 32  # activation block length


# adding then subtracting 1.5 * 2^23 rounds a float32 of magnitude < 2^22 to the nearest integer,
# ties to even (= np.rint), in vector registers (np.rint became a scalar call per element)
_ROUND_MAGIC = np.float32(12582912.0)


@nb.njit(nogil=True, cache=True, inline="always")
def _q8_rows(x, xq, xd, xs):
    n, k = x.shape
    nb_ = k // QK
    xb = x.view(np.int32)  # [n, k] the float bits: |x| ordered as its int bits (a max that vectorizes)
    for r in nb.prange(n):
        cell = np.empty(1, np.int32)  # bits -> float32 through memory
        cellf = cell.view(np.float32)
        for b in range(nb_):
            base = b * QK
            mbits = np.int32(0)
            for j in range(QK):
                mbits = max(mbits, np.int32(xb[r, base + j] & np.int32(0x7FFFFFFF)))
            cell[0] = mbits
            amax = cellf[0]  # the largest |x| of the block
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            s = np.int32(0)
            for j in range(QK):
                q = np.int32((x[r, base + j] * inv + _ROUND_MAGIC) - _ROUND_MAGIC)
                xq[r, base + j] = np.int8(q)
                s = np.int32(s + q)
            xd[r, b] = d
            xs[r, b] = s


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=False)
def quantize_rows_q8(x, xq, xd, xs):
    """x float32 [n, k] -> xq int8 [n, k], xd float32 [n, k//32] scales, xs int32 [n, k//32] sums."""
    _q8_rows(x, xq, xd, xs)


@nb.njit(nogil=True, cache=True, fastmath=False)
def quantize_row_q8_serial(x, xq, xd, xs):
    """quantize_rows_q8 in the calling thread: one row (decode) is ~1 us of work, less than
    waking the thread pool costs."""
    _q8_rows(x, xq, xd, xs)


@nb.njit(cache=True, nogil=True)
def quantized_q8(x):
    """quantize_activations(x) for float32 C-contiguous [n, k] inside a compiled call: the same
    kernels, picked by the same size rule (runs_serial), so the same bits."""
    n, k = x.shape
    xq = np.empty((n, k), np.int8)  # [n, k]
    xd = np.empty((n, k // QK), np.float32)  # [n, k/32]
    xs = np.empty((n, k // QK), np.int32)  # [n, k/32]
    if x.size <= SERIAL_ELEMENTS:
        quantize_row_q8_serial(x, xq, xd, xs)
    else:
        quantize_rows_q8(x, xq, xd, xs)
    return xq, xd, xs


QK_K = 256  # Q8_K superblock length


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=False)
def quantize_rows_q8_K(x, xq, xd, xs):
    """Like quantize_rows_q8 on llama.cpp's Q8_K grid: one scale per 256 (see the module docstring)."""
    n, k = x.shape
    nsb = k // QK_K
    for t in nb.prange(n * nsb):
        r = t // nsb
        base = (t % nsb) * QK_K
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for j in range(QK_K):  # first value of largest magnitude, as quantize_row_q8_K_ref
            v = x[r, base + j]
            if abs(v) > amax:
                amax = abs(v)
                mx = v
        iscale = np.float32(-127.0) / mx if amax > 0 else np.float32(0.0)
        d = np.float32(1.0) / iscale if amax > 0 else np.float32(0.0)
        for b in range(QK_K // QK):
            s = np.int32(0)
            for j in range(QK):
                q = np.int32(np.rint(x[r, base + b * QK + j] * iscale))
                if q > 127:
                    q = np.int32(127)
                xq[r, base + b * QK + j] = np.int8(q)
                s = np.int32(s + q)
            xd[r, base // QK + b] = d
            xs[r, base // QK + b] = s


def quantize_activations(x: np.ndarray, grid: str = "q8_32"):
    """Quantize float32 activations [n, k] (k a multiple of 32) -> (xq, xd, xs).

    grid: "q8_32" (per-32 scales, the default) or "q8_K" (llama.cpp's per-256 Q8_K grid in the same
    per-32 layout; k a multiple of 256)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"activations must be [n, k], got shape {x.shape}")
    n, k = x.shape
    if grid not in ("q8_32", "q8_K"):
        raise ValueError(f"unknown activation grid {grid!r} (q8_32 or q8_K)")
    step = QK_K if grid == "q8_K" else QK
    if k % step:
        raise ValueError(f"activation width {k} is not a multiple of {step} (grid {grid})")
    xq = np.empty((n, k), dtype=np.int8)  # [n, k]
    xd = np.empty((n, k // QK), dtype=np.float32)  # [n, k/32]
    xs = np.empty((n, k // QK), dtype=np.int32)  # [n, k/32]
    if grid == "q8_K":
        quantize_rows_q8_K(x, xq, xd, xs)
    else:
        (quantize_row_q8_serial if runs_serial(x) else quantize_rows_q8)(x, xq, xd, xs)
    return xq, xd, xs
