"""2-bit codebook quants: IQ2_XXS, IQ2_XS, IQ2_S. Each group of 8 weights is one entry of a grid of
8 magnitudes in {8, 25, 43} (edged.quant.iq_grids), with 8 sign bits and a 4-bit scale per 16 or 32.

Byte layout of one super-block of 256 weights (little-endian; e = element, g = 8-element group e//8):
    IQ2_XXS (66 B): [0:2) d fp16 | [2:66) 8 x (aux0 uint32, aux1 uint32), one pair per 32 elements:
        byte l of aux0 = grid index of group l of the 32; bits 7l..7l+6 of aux1 = ksigns index of
        group l; bits 28..31 of aux1 = scale s                  db = d * (0.5 + s) * 0.25
    IQ2_XS (74 B): [0:2) d | [2:66) 32 uint16, one per group: bits 0..8 grid index, 9..15 ksigns
        index | [66:74) scales: nibble (g//2)%2 of byte g//4 is the scale of 16 elements
                                                                db = d * (0.5 + s) * 0.25
    IQ2_S (82 B): [0:2) d | [2:34) qs: low 8 bits of group g's grid index | [34:66) signs: byte g
        holds group g's 8 sign bits | [66:74) qh: bits 2(g%4)..+1 of byte g//4 = index bits 8..9
        | [74:82) scales as IQ2_XS                              db = d * (0.5 + s) * 0.25
Every type: w = db * grid[index][e%8] * (-1 if sign bit e%8 else 1), in gguf-py's order (bit-exact).
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at
from edged.quant.iq_grids import (IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID,
                                  KSIGNS_IQ2XS, QK_K)


@nb.njit(cache=True, nogil=True, inline="always")
def u32_at(raw, off):
    """Little-endian uint32 at raw[off:off+4] as an int64 (no unsigned/signed mixing in Numba)."""
    return (np.int64(raw[off]) | (np.int64(raw[off + 1]) << 8) | (np.int64(raw[off + 2]) << 16)
            | (np.int64(raw[off + 3]) << 24))


@nb.njit(cache=True, nogil=True, inline="always")
def put_group(out, r, at, db, grid_row, signs):
    """out[r, at:at+8] = db * grid_row[j] * (+-1 by bit j of signs): one 8-element group."""
    for j in range(8):
        sign = np.float32(-1.0) if (signs >> j) & 1 else np.float32(1.0)
        out[r, at + j] = db * np.float32(grid_row[j]) * sign


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq2_xxs(raw, out):
    """raw uint8 [n_rows, n_blocks*66] -> out float32 [n_rows, n_blocks*256]."""
    grid, ksigns = IQ2XXS_GRID, KSIGNS_IQ2XS
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ2_XXS_BYTES
            d = f16_at(row, o)
            for ib in range(8):
                q = o + 2 + 8 * ib
                aux1 = u32_at(row, q + 4)
                db = d * (np.float32(0.5) + np.float32(aux1 >> 28)) * np.float32(0.25)
                for l in range(4):
                    signs = ksigns[(aux1 >> (7 * l)) & 127]
                    put_group(out, r, b * QK_K + ib * 32 + l * 8, db, grid[row[q + l]], signs)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq2_xs(raw, out):
    """raw uint8 [n_rows, n_blocks*74] -> out float32 [n_rows, n_blocks*256]."""
    grid, ksigns = IQ2XS_GRID, KSIGNS_IQ2XS
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ2_XS_BYTES
            d = f16_at(row, o)
            for g in range(32):
                s = (row[o + 66 + (g >> 2)] >> (4 * ((g >> 1) & 1))) & 0xF
                db = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)
                q = np.int64(row[o + 2 + 2 * g]) | (np.int64(row[o + 3 + 2 * g]) << 8)
                put_group(out, r, b * QK_K + g * 8, db, grid[q & 511], ksigns[q >> 9])


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq2_s(raw, out):
    """raw uint8 [n_rows, n_blocks*82] -> out float32 [n_rows, n_blocks*256]."""
    grid = IQ2S_GRID
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ2_S_BYTES
            d = f16_at(row, o)
            for g in range(32):
                s = (row[o + 74 + (g >> 2)] >> (4 * ((g >> 1) & 1))) & 0xF
                db = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)
                hi = (np.int64(row[o + 66 + (g >> 2)]) >> (2 * (g & 3))) & 3
                idx = np.int64(row[o + 2 + g]) | (hi << 8)
                put_group(out, r, b * QK_K + g * 8, db, grid[idx], row[o + 34 + g])
