"""Non-linear 4-bit quants: IQ4_NL and IQ4_XS; a 4-bit index picks one of 16 int8 levels.

Byte layout of one block:
    IQ4_NL (18 B, 32 elements):  [0:2) d fp16 | [2:18) qs; byte qs[l] holds the index of element l
        (low nibble) and of element l + 16 (high nibble)            w = d * KVALUES[idx]
    IQ4_XS (136 B, 256 elements in 8 sub-blocks of 32):
        [0:2) d fp16 | [2:4) scales_h uint16: bits 2s..2s+1 = high 2 bits of sub-block s's scale
        [4:8) scales_l: nibble (s%2) of byte s//2 = low 4 bits of scale s
        [8:136) qs: 16 bytes per sub-block, nibble order as IQ4_NL
                                                        w = (d * (scale - 32)) * KVALUES[idx]
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at

# the 16 levels shared by both types (llama.cpp's kvalues_iq4nl)
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# as float32 for the kernels: every level is exact in float32
_KV_F32 = KVALUES.astype(np.float32)

QK4_NL = 32
IQ4_NL_BYTES = 18
QK_K = 256
IQ4_XS_BYTES = 136


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq4_nl(raw, out):
    """raw uint8 [n_rows, n_blocks*18] -> out float32 [n_rows, n_blocks*32]."""
    kv = _KV_F32
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK4_NL):
            o = b * IQ4_NL_BYTES
            d = f16_at(row, o)
            base = b * QK4_NL
            for l in range(16):
                v = row[o + 2 + l]
                out[r, base + l] = d * kv[v & 0xF]
                out[r, base + l + 16] = d * kv[v >> 4]


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq4_xs(raw, out):
    """raw uint8 [n_rows, n_blocks*136] -> out float32 [n_rows, n_blocks*256]."""
    kv = _KV_F32
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ4_XS_BYTES
            d = f16_at(row, o)
            scales_h = np.int32(row[o + 2]) | (np.int32(row[o + 3]) << 8)
            base = b * QK_K
            for s in range(8):
                lo = (np.int32(row[o + 4 + (s >> 1)]) >> (4 * (s & 1))) & 0xF
                hi = (scales_h >> (2 * s)) & 3
                dl = d * np.float32((lo | (hi << 4)) - 32)
                qo = o + 8 + s * 16
                so = base + s * 32
                for l in range(16):
                    v = row[qo + l]
                    out[r, so + l] = dl * kv[v & 0xF]
                    out[r, so + l + 16] = dl * kv[v >> 4]
