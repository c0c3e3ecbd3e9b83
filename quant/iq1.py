"""1.5-bit codebook quants: IQ1_S, IQ1_M. Each 8-element group is one entry of a ternary grid
(edged.quant.iq_grids.IQ1S_GRID, values -1/0/1) shifted by +-IQ1S_DELTA and scaled.

Byte layout of one super-block of 256 weights (little-endian; e = element, k = 8-element group e//8):
    IQ1_S (50 B): [0:2) d fp16 | [2:34) qs: byte k = low 8 bits of group k's 11-bit grid index
        | [34:50) 8 uint16 qh, one per 32 elements (ib = k//4): bits 3(k%4)..+2 = index bits 8..10,
        bits 12..14 = scale s, bit 15 = delta sign        dl = d * (2s + 1)
    IQ1_M (56 B): [0:32) qs as IQ1_S | [32:48) qh: nibble k%2 of byte k//2: bits 0..2 = index bits
        8..10, bit 3 = delta sign of group k | [48:56) 4 uint16 scales: bits 3j..3j+2 of scales[i] =
        scale s of 16 elements 4i+j (= k//2); the top nibbles of scales[0..3] are the fp16 d's
        bits 0-3, 4-7, 8-11, 12-15                         dl = d * (2s + 1)
Both: w = dl * (grid[index][e%8] + delta), delta = -0.125 if the sign bit is set else 0.125.
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at, f16_bits_to_f32, u16_at
from edged.quant.iq_grids import IQ1_M_BYTES, IQ1_S_BYTES, IQ1S_DELTA, IQ1S_GRID, QK_K


@nb.njit(cache=True, nogil=True, inline="always")
def put_group(out, r, at, dl, grid_row, negative_delta):
    """out[r, at:at+8] = dl * (grid_row[j] + delta): one 8-element group."""
    delta = np.float32(-IQ1S_DELTA) if negative_delta else np.float32(IQ1S_DELTA)
    for j in range(8):
        out[r, at + j] = dl * (np.float32(grid_row[j]) + delta)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq1_s(raw, out):
    """raw uint8 [n_rows, n_blocks*50] -> out float32 [n_rows, n_blocks*256]."""
    grid = IQ1S_GRID
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ1_S_BYTES
            d = f16_at(row, o)
            for ib in range(8):
                qh = np.int64(u16_at(row, o + 34 + 2 * ib))
                dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
                for l in range(4):
                    idx = np.int64(row[o + 2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)
                    put_group(out, r, b * QK_K + ib * 32 + l * 8, dl, grid[idx], qh & 0x8000)


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_iq1_m(raw, out):
    """raw uint8 [n_rows, n_blocks*56] -> out float32 [n_rows, n_blocks*256]."""
    grid = IQ1S_GRID
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * IQ1_M_BYTES
            sc0 = np.int64(u16_at(row, o + 48))
            sc1 = np.int64(u16_at(row, o + 50))
            sc2 = np.int64(u16_at(row, o + 52))
            sc3 = np.int64(u16_at(row, o + 54))
            bits = (sc0 >> 12) | ((sc1 >> 8) & 0x00F0) | ((sc2 >> 4) & 0x0F00) | (sc3 & 0xF000)
            d = f16_bits_to_f32(np.uint16(bits))
            for k in range(32):
                h = k >> 1  # 16-element scale group
                sc = np.int64(u16_at(row, o + 48 + 2 * (h >> 2)))
                dl = d * np.float32(2 * ((sc >> (3 * (h & 3))) & 7) + 1)
                nib = (np.int64(row[o + 32 + (k >> 1)]) >> (4 * (k & 1))) & 0xF
                idx = np.int64(row[o + k]) | ((nib & 7) << 8)
                put_group(out, r, b * QK_K + k * 8, dl, grid[idx], nib & 8)
