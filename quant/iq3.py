"""3-bit codebook quants: IQ3_XXS, IQ3_S. Each grid entry is 4 magnitudes (edged.quant.iq_grids:
IQ3XXS_GRID levels 4..62, IQ3S_GRID levels 1..15); two entries and 8 sign bits make an 8-element group.

Byte layout of one super-block of 256 weights (little-endian; e = element, g = group e//8, k = e//4):
    IQ3_XXS (98 B): [0:2) d fp16 | [2:66) qs: byte k = grid index of elements 4k..4k+3
        | [66:98) 8 uint32 aux, one per 32 elements: bits 7l..7l+6 = ksigns index of group l of the 32,
        bits 28..31 = scale s                                  db = d * (0.5 + s) * 0.5
    IQ3_S (110 B): [0:2) d | [2:66) qs: low 8 bits of index k | [66:74) qh: bit k%8 of byte k//8 =
        index bit 8 | [74:106) signs: byte g = group g's 8 sign bits
        | [106:110) scales: nibble ib%2 of byte ib//2 = scale of the 32 elements ib
                                                               db = d * (1 + 2 * s)
Both: w = db * grid[index][e%4] * (-1 if sign bit e%8 else 1), in gguf-py's order (bit-exact).
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at
from edged.quant.iq2 import u32_at
from edged.quant.iq_grids import IQ3_S_BYTES, IQ3_XXS_BYTES, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, QK_K


@nb.njit(cache=True, nogil=True, inline="always")
def put_group(out, r, at, db, lo_row, hi_row, signs):
    """out[r, at:at+8] = db * (lo_row ++ hi_row)[j] * (+-1 by bit j of signs): two 4-wide grid entries."""
    for j in range(8):
        sign = np.float32(-1.0) if (signs >> j) & 1 else np.float32(1.0)
        v = lo_row[j] if j < 4 else hi_row[j - 4]
        out[r, at + j] = db * np.float32(v) * sign


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq3_xxs(raw, out):
    """raw uint8 [n_rows, n_blocks*98] -> out float32 [n_rows, n_blocks*256]."""
    grid, ksigns = IQ3XXS_GRID, KSIGNS_IQ2XS
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ3_XXS_BYTES
            d = f16_at(row, o)
            for ib in range(8):
                aux = u32_at(row, o + 66 + 4 * ib)
                db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
                for l in range(4):
                    k = o + 2 + 8 * ib + 2 * l
                    signs = ksigns[(aux >> (7 * l)) & 127]
                    put_group(out, r, b * QK_K + ib * 32 + l * 8, db, grid[row[k]], grid[row[k + 1]], signs)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq3_s(raw, out):
    """raw uint8 [n_rows, n_blocks*110] -> out float32 [n_rows, n_blocks*256]."""
    grid = IQ3S_GRID
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ3_S_BYTES
            d = f16_at(row, o)
            for ib in range(8):
                s = (row[o + 106 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF
                db = d * np.float32(1 + 2 * s)
                qh = np.int64(row[o + 66 + ib])
                for l in range(4):
                    k = 8 * ib + 2 * l  # first of the group's two grid indices
                    i0 = np.int64(row[o + 2 + k]) | (((qh >> (2 * l)) & 1) << 8)
                    i1 = np.int64(row[o + 3 + k]) | (((qh >> (2 * l + 1)) & 1) << 8)
                    put_group(out, r, b * QK_K + ib * 32 + l * 8, db, grid[i0], grid[i1], row[o + 74 + 4 * ib + l])
