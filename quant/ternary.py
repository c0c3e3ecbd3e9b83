"""Ternary quants: TQ1_0, TQ2_0; every weight is d * t with t in {-1, 0, 1}.

Byte layout of one super-block of 256 weights (little-endian; e = element):
    TQ1_0 (54 B): [0:48) qs, [48:52) qh: base-3 packed trits (a byte b holding n trits stores
        ceil(value * 256 / 3^n); trit p is ((b * 3^p mod 256) * 3) >> 8). qs[0:32): trit p of byte m
        is e = 32p + m (e < 160); qs[32:48): e = 160 + 16p + m; qh: 4 trits a byte, e = 240 + 4p + m
        | [52:54) d fp16                                          w = d * (trit - 1)
    TQ2_0 (66 B): [0:64) qs: bits 2p..2p+1 of byte 32c + m are element 128c + 32p + m | [64:66) d
                                                                  w = d * (q - 1)
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at
from edged.quant.iq_grids import QK_K, TQ1_0_BYTES, TQ2_0_BYTES

_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.int64)


@nb.njit(cache=True, nogil=True, inline="always")
def trit(byte, p):
    """Trit p (0..2) of a base-3 packed byte: the top of (byte * 3^p mod 256) times 3."""
    return (((np.int64(byte) * _POW3[p]) & 0xFF) * 3) >> 8


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_tq1_0(raw, out):
    """raw uint8 [n_rows, n_blocks*54] -> out float32 [n_rows, n_blocks*256]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * TQ1_0_BYTES
            d = f16_at(row, o + 52)
            base = b * QK_K
            for p in range(5):
                for m in range(32):
                    out[r, base + 32 * p + m] = d * np.float32(trit(row[o + m], p) - 1)
                for m in range(16):
                    out[r, base + 160 + 16 * p + m] = d * np.float32(trit(row[o + 32 + m], p) - 1)
            for p in range(4):
                for m in range(4):
                    out[r, base + 240 + 4 * p + m] = d * np.float32(trit(row[o + 48 + m], p) - 1)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_tq2_0(raw, out):
    """raw uint8 [n_rows, n_blocks*66] -> out float32 [n_rows, n_blocks*256]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * TQ2_0_BYTES
            d = f16_at(row, o + 64)
            base = b * QK_K
            for c in range(2):
                for p in range(4):
                    for m in range(32):
                        q = (np.int64(row[o + 32 * c + m]) >> (2 * p)) & 3
                        out[r, base + 128 * c + 32 * p + m] = d * np.float32(q - 1)
