"""MXFP4 (OCP microscaling FP4): blocks of 32 E2M1 values sharing one E8M0 power-of-two scale.

Byte layout of one block (17 B, 32 elements):
    [0:1) e: E8M0 exponent byte | [1:17) qs: low nibble of byte m = element m, high nibble = m + 16;
    each nibble indexes kvalues_mxfp4 (edged.quant.iq_grids.MXFP4_VALUES, the E2M1 values doubled)
    w = half(e) * MXFP4_VALUES[nibble], half(e) = 2^(e - 128) (ggml's e8m0_to_fp32_half: the
    doubled table's factor 1/2 folded into the scale; e = 0 and 1 give the subnormals 2^-128, 2^-127)
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f32_from_bits
from edged.quant.iq_grids import MXFP4_BYTES, MXFP4_VALUES, QK_MXFP4

_KV_F32 = MXFP4_VALUES.astype(np.float32)  # exact


@nb.njit(cache=True, nogil=True, inline="always")
def e8m0_half(e):
    """float32 2^(e - 128) for an E8M0 byte e, as bits (exact; subnormal for e < 2)."""
    e = np.uint32(e)
    if e < np.uint32(2):
        return f32_from_bits(np.uint32(0x00200000) << e)
    return f32_from_bits((e - np.uint32(1)) << np.uint32(23))


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_mxfp4(raw, out):
    """raw uint8 [n_rows, n_blocks*17] -> out float32 [n_rows, n_blocks*32]."""
    kv = _KV_F32
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_MXFP4):
            o = b * MXFP4_BYTES
            d = e8m0_half(row[o])
            base = b * QK_MXFP4
            for m in range(16):
                v = row[o + 1 + m]
                out[r, base + m] = d * kv[v & 0xF]
                out[r, base + m + 16] = d * kv[v >> 4]
