"""Q8_0: blocks of 32 int8 weights with one fp16 scale; w = q * d.

Byte layout of one 34-byte block:
    [0:2)   d   fp16 scale
    [2:34)  qs  32 x int8, element j = qs[j]
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at

QK8_0 = 32
Q8_0_BYTES = 34


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q8_0(raw, out):
    """raw uint8 [n_rows, n_blocks*34] -> out float32 [n_rows, n_blocks*32]."""
    n_rows, n_cols = out.shape
    n_blocks = n_cols // QK8_0
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_blocks):
            o = b * Q8_0_BYTES
            d = f16_at(row, o)
            base = b * QK8_0
            for j in range(QK8_0):
                # the uint8 byte reinterpreted as int8
                q = np.float32(np.int8(row[o + 2 + j]))
                out[r, base + j] = q * d
