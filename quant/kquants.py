"""K-quants: super-blocks of 256 weights in 16- or 32-element sub-blocks with quantized scales.

Byte layout of one super-block (all fp16 little-endian; e = element index 0..255):
    Q2_K (84 B):  [0:16) scales: low nibble = scale, high nibble = min, one per 16 elements
                  [16:80) qs: 2-bit q of e at qs[(e//128)*32 + e%32] >> 2*((e%128)//32)
                  [80:82) d, [82:84) dmin                   w = (d*sc)*q - (dmin*m)
    Q3_K (110 B): [0:32) hmask: bit (e//32) of hmask[e%32] set -> no -4 offset
                  [32:96) qs: low 2 bits, placed as in Q2_K
                  [96:108) 16 six-bit scales (packing in _q3_k_scale), [108:110) d
                                                            w = (d*(sc-32)) * (q2 - 4*!hbit)
    Q4_K (144 B): [0:2) d, [2:4) dmin, [4:16) 8 six-bit scale/min pairs (packing in _k_scale_min)
                  [16:144) qs: 4-bit q of e at qs[(e//64)*32 + e%32] >> 4*((e%64)//32)
                                                            w = (d*sc)*q - (dmin*m)
    Q5_K (176 B): as Q4_K, then [16:48) qh: bit 4 of q(e) is bit (e//32) of qh[e%32]; [48:176) qs
    Q6_K (210 B): [0:128) ql: low 4 bits at ql[(e//128)*64 + e%64] >> 4*((e%128)//64)
                  [128:192) qh: high 2 bits at qh[(e//128)*32 + e%32] >> 2*((e%128)//32)
                  [192:208) 16 int8 scales, one per 16 elements, [208:210) d
                                                            w = (d*sc) * (q - 32)
Scale products are formed first and then applied, in gguf-py's order, for bit-exact results.
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at

QK_K = 256
Q2_K_BYTES = 84
Q3_K_BYTES = 110
Q4_K_BYTES = 144
Q5_K_BYTES = 176
Q6_K_BYTES = 210


@nb.njit(cache=True, nogil=True, inline="always")
def _k_scale_min(row, o, s):
    """Six-bit (scale, min) of sub-block s (0..7) from the 12 packed bytes at row[o:o+12].

    Bytes 0-3: scale s<4 in low 6 bits, top 2 bits of scale s+4; bytes 4-7 the same for mins;
    bytes 8-11: low nibble = low 4 bits of scale s+4, high nibble = low 4 bits of min s+4.
    """
    if s < 4:
        sc = np.int32(row[o + s] & 0x3F)
        m = np.int32(row[o + 4 + s] & 0x3F)
    else:
        sc = np.int32((row[o + 4 + s] & 0x0F) | ((row[o + s - 4] >> 2) & 0x30))
        m = np.int32((row[o + 4 + s] >> 4) | ((row[o + s] >> 2) & 0x30))
    return sc, m


@nb.njit(cache=True, nogil=True, inline="always")
def _q3_k_scale(row, o, g):
    """Signed scale of 16-element group g (0..15) from the 12 packed bytes at row[o:o+12].

    Low 4 bits: nibble (g//8) of byte g%8; high 2 bits: bits 2*(g//4) of byte 8 + g%4; minus 32.
    """
    lo = (row[o + (g & 7)] >> (4 * (g >> 3))) & 0x0F
    hi = (row[o + 8 + (g & 3)] >> (2 * (g >> 2))) & 0x03
    return np.int32(lo | (hi << 4)) - 32


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q2_k(raw, out):
    """raw uint8 [n_rows, n_blocks*84] -> out float32 [n_rows, n_blocks*256]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * Q2_K_BYTES
            d = f16_at(row, o + 80)
            dmin = f16_at(row, o + 82)
            base = b * QK_K
            for g in range(16):
                sb = row[o + g]
                dl = d * np.float32(sb & 0xF)
                ml = dmin * np.float32(sb >> 4)
                for i in range(16):
                    e = g * 16 + i
                    q = (row[o + 16 + (e >> 7) * 32 + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3
                    out[r, base + e] = dl * np.float32(q) - ml


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q3_k(raw, out):
    """raw uint8 [n_rows, n_blocks*110] -> out float32 [n_rows, n_blocks*256]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * Q3_K_BYTES
            d = f16_at(row, o + 108)
            base = b * QK_K
            for g in range(16):
                dl = d * np.float32(_q3_k_scale(row, o + 96, g))
                for i in range(16):
                    e = g * 16 + i
                    q = np.int32((row[o + 32 + (e >> 7) * 32 + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3)
                    hbit = np.int32((row[o + (e & 31)] >> (e >> 5)) & 1)
                    out[r, base + e] = dl * np.float32(q - 4 * (1 - hbit))


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q4_k(raw, out):
    """raw uint8 [n_rows, n_blocks*144] -> out float32 [n_rows, n_blocks*256]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * Q4_K_BYTES
            d = f16_at(row, o)
            dmin = f16_at(row, o + 2)
            base = b * QK_K
            for s in range(8):
                sc, m = _k_scale_min(row, o + 4, s)
                dl = d * np.float32(sc)
                ml = dmin * np.float32(m)
                qo = o + 16 + (s >> 1) * 32
                sh = 4 * (s & 1)
                for l in range(32):
                    q = (row[qo + l] >> sh) & 0xF
                    out[r, base + s * 32 + l] = dl * np.float32(q) - ml


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q5_k(raw, out):
    """raw uint8 [n_rows, n_blocks*176] -> out float32 [n_rows, n_blocks*256]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * Q5_K_BYTES
            d = f16_at(row, o)
            dmin = f16_at(row, o + 2)
            base = b * QK_K
            for s in range(8):
                sc, m = _k_scale_min(row, o + 4, s)
                dl = d * np.float32(sc)
                ml = dmin * np.float32(m)
                qo = o + 48 + (s >> 1) * 32
                sh = 4 * (s & 1)
                for l in range(32):
                    q = ((row[qo + l] >> sh) & 0xF) | (((row[o + 16 + l] >> s) & 1) << 4)
                    out[r, base + s * 32 + l] = dl * np.float32(q) - ml


@nb.njit(cache=True, nogil=True, parallel=True)
def dequantize_q6_k(raw, out):
    """raw uint8 [n_rows, n_blocks*210] -> out float32 [n_rows, n_blocks*256]."""
    n_rows, n_cols = out.shape
    for r in nb.prange(n_rows):
        row = raw[r]
        for b in range(n_cols // QK_K):
            o = b * Q6_K_BYTES
            d = f16_at(row, o + 208)
            base = b * QK_K
            for g in range(16):
                dl = d * np.float32(np.int8(row[o + 192 + g]))
                for i in range(16):
                    e = g * 16 + i
                    h = e >> 7  # which 128-element half
                    lo = (row[o + h * 64 + (e & 63)] >> (4 * ((e & 127) >> 6))) & 0xF
                    hi = (row[o + 128 + h * 32 + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3
                    out[r, base + e] = dl * np.float32(np.int32(lo | (hi << 4)) - 32)
