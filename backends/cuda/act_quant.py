"""Activation quantization on the device, bit-identical to backends/cpu/act_quant.py: x float32
[n, k] -> xq int8 [n, k], xd float32 [n, k/32] (amax/127), xs int32 [n, k/32] block sums, with
q = rint(x · (1/d)) rounded half to even."""

import numpy as np
from numba import cuda, float32, int32

from edged.backends.cuda.launch import launch_1d

QK = 32


@cuda.jit
def _quantize_blocks(x, xq, xd, xs):
    """One thread per (token, 32-block)."""
    n, k = x.shape
    nblk = k // QK
    i = cuda.grid(1)
    if i >= n * nblk:
        return
    r = i // nblk
    base = (i % nblk) * QK
    amax = float32(0.0)
    for j in range(QK):
        v = abs(x[r, base + j])
        if v > amax:
            amax = v
    d = amax / float32(127.0)
    inv = float32(1.0) / d if d > float32(0.0) else float32(0.0)
    s = int32(0)
    for j in range(QK):
        q = int32(round(x[r, base + j] * inv))  # round(): half to even, like np.rint
        xq[r, base + j] = q
        s += q
    xd[r, i % nblk] = d
    xs[r, i % nblk] = s


def quantize_activations(x):
    """Device x float32 [n, k] (k a multiple of 32) -> device (xq, xd, xs)."""
    n, k = x.shape
    if k % QK:
        raise ValueError(f"activation width {k} is not a multiple of {QK}")
    xq = cuda.device_array((n, k), dtype=np.int8)  # [n, k]
    xd = cuda.device_array((n, k // QK), dtype=np.float32)  # [n, k/32]
    xs = cuda.device_array((n, k // QK), dtype=np.int32)  # [n, k/32]
    if n:
        blocks, threads = launch_1d(n * (k // QK), 128)
        _quantize_blocks[blocks, threads](x, xq, xd, xs)
    return xq, xd, xs
