"""Legacy 32-element quants: Q4_0, Q4_1, Q5_0, Q5_1.

Nibble order: byte qs[l] (l < 16) holds element l in its low nibble and element l + 16 in its high
nibble. Q5 types add bit 4 of element j as bit j of the little-endian uint32 qh.

Byte layout of one block:
    Q4_0 (18 B): [0:2) d fp16 | [2:18) qs                 w = d * (q - 8)
    Q4_1 (20 B): [0:2) d fp16 | [2:4) m fp16 | [4:20) qs  w = d * q + m
    Q5_0 (22 B): [0:2) d fp16 | [2:6) qh | [6:22) qs      w = d * (q - 16)
    Q5_1 (24 B): [0:2) d fp16 | [2:4) m fp16 | [4:8) qh | [8:24) qs   w = d * q + m
Float operation order follows gguf-py (products first, then the min added) for bit-exact results.
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at

QK = 32
Q4_0_BYTES = 18
Q4_1_BYTES = 20
Q5_0_BYTES = 22
Q5_1_BYTES = 24


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q4_0(raw, out):
    """raw uint8 [n_rows, n_blocks*18] -> out float32 [n_rows, n_blocks*32]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK):
            o = b * Q4_0_BYTES
            d = f16_at(row, o)
            base = b * QK
            for l in range(16):
                v = row[o + 2 + l]
                out[r, base + l] = d * np.float32(np.int32(v & 0xF) - 8)
                out[r, base + l + 16] = d * np.float32(np.int32(v >> 4) - 8)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q4_1(raw, out):
    """raw uint8 [n_rows, n_blocks*20] -> out float32 [n_rows, n_blocks*32]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK):
            o = b * Q4_1_BYTES
            d = f16_at(row, o)
            m = f16_at(row, o + 2)
            base = b * QK
            for l in range(16):
                v = row[o + 4 + l]
                out[r, base + l] = d * np.float32(v & 0xF) + m
                out[r, base + l + 16] = d * np.float32(v >> 4) + m


@nb.njit(cache=True, nogil=True, inline="always")
def _qh_u32(row, o):
    return (
        np.uint32(row[o])
        | (np.uint32(row[o + 1]) << np.uint32(8))
        | (np.uint32(row[o + 2]) << np.uint32(16))
        | (np.uint32(row[o + 3]) << np.uint32(24))
    )


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q5_0(raw, out):
    """raw uint8 [n_rows, n_blocks*22] -> out float32 [n_rows, n_blocks*32]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK):
            o = b * Q5_0_BYTES
            d = f16_at(row, o)
            qh = _qh_u32(row, o + 2)
            base = b * QK
            for l in range(16):
                v = np.uint32(row[o + 6 + l])
                lo = (v & np.uint32(0xF)) | (((qh >> np.uint32(l)) & np.uint32(1)) << np.uint32(4))
                hi = (v >> np.uint32(4)) | (((qh >> np.uint32(l + 16)) & np.uint32(1)) << np.uint32(4))
                out[r, base + l] = d * np.float32(np.int32(lo) - 16)
                out[r, base + l + 16] = d * np.float32(np.int32(hi) - 16)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q5_1(raw, out):
    """raw uint8 [n_rows, n_blocks*24] -> out float32 [n_rows, n_blocks*32]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK):
            o = b * Q5_1_BYTES
            d = f16_at(row, o)
            m = f16_at(row, o + 2)
            qh = _qh_u32(row, o + 4)
            base = b * QK
            for l in range(16):
                v = np.uint32(row[o + 8 + l])
                lo = (v & np.uint32(0xF)) | (((qh >> np.uint32(l)) & np.uint32(1)) << np.uint32(4))
                hi = (v >> np.uint32(4)) | (((qh >> np.uint32(l + 16)) & np.uint32(1)) << np.uint32(4))
                out[r, base + l] = d * np.float32(lo) + m
                out[r, base + l + 16] = d * np.float32(hi) + m
