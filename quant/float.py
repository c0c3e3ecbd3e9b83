"""Float tensor types: F32, F16, BF16 (block size 1; little-endian elements, no scales).

Byte layout of one element:
    F32   4 bytes  IEEE binary32
    F16   2 bytes  IEEE binary16
    BF16  2 bytes  top 16 bits of a binary32
Conversions are exact (no rounding), so ±0, subnormals, inf and NaN payloads survive bit for bit.
"""

import numba as nb
import numpy as np

from edged.quant.f16 import bf16_bits_to_f32, f16_at, f32_from_bits, u16_at

F32_BYTES = 4
F16_BYTES = 2
BF16_BYTES = 2


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_f32(raw, out):
    """raw uint8 [n_rows, 4*n_cols] -> out float32 [n_rows, n_cols]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for i in range(n_cols):
            o = i * F32_BYTES
            bits = (
                np.uint32(row[o])
                | (np.uint32(row[o + 1]) << np.uint32(8))
                | (np.uint32(row[o + 2]) << np.uint32(16))
                | (np.uint32(row[o + 3]) << np.uint32(24))
            )
            out[r, i] = f32_from_bits(bits)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_f16(raw, out):
    """raw uint8 [n_rows, 2*n_cols] -> out float32 [n_rows, n_cols]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for i in range(n_cols):
            out[r, i] = f16_at(row, i * F16_BYTES)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_bf16(raw, out):
    """raw uint8 [n_rows, 2*n_cols] -> out float32 [n_rows, n_cols]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for i in range(n_cols):
            out[r, i] = bf16_bits_to_f32(u16_at(row, i * BF16_BYTES))
