"""Scalar superblock decoders for the K-quant types without hand-written vector code: Q2_K, Q3_K,
IQ4_XS (Q4_K, Q5_K and Q6_K are in kquant_simd.py).

Each turns one 256-element superblock into *unsigned* bytes q[256] plus float scales, so the
integer dot is always u8 × i8 → int32:
    w_e = ws[b] · q_e - wm[h]   for 32-block b = e // 32 and 16-half h = e // 16   (one-dot types)
Q2_K and Q3_K fold their 16-element sub-block scales into the weight bytes (|scale| × q fits a
byte); offsets and mins (Q2_K mins, Q3_K's -4, IQ4_XS's +128 shift) are wm.
"""

import numba as nb
import numpy as np

from edged.quant.f16 import f16_at

QK_K = 256
NBLK = QK_K // 32  # 32-element activation blocks per superblock

# type codes of the shared kernels
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS = 0, 1, 2, 3, 4, 5
BLOCK_BYTES = np.array([84, 110, 144, 176, 210, 136], dtype=np.int64)

# IQ4_NL/IQ4_XS non-linear levels, shifted by +128 so they are unsigned bytes
IQ4_LEVELS_U8 = (np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int32
) + 128).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Hot loops index with uint64 offsets and never slice: a slice costs two atomic refcount calls,
# and a signed index costs a negative-wraparound select that keeps LLVM from emitting vpdpbusd.
# Decoders: row uint8 [row_bytes], superblock at byte `o` (uint64) -> q uint8 [256] unsigned
# levels, ws float32 [8] per 32-block, wm float32 [16] per 16-half.
# ---------------------------------------------------------------------------------------------

_U = np.uint64


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_q2_k(row, o, q, ws, wm):
    # scales[16] | qs[64] | d | dmin; element e: qs[32*(e//128) + e%32] >> 2*((e%128)//32) & 3
    io = np.int64(o)
    d = f16_at(row, io + 80)
    dmin = f16_at(row, io + 82)
    for b in range(NBLK):
        src = o + _U(16 + 32 * (b // 4))
        sh = np.uint8(2 * (b % 4))
        sc_lo = row[io + 2 * b]
        sc_hi = row[io + 2 * b + 1]
        a_lo = sc_lo & np.uint8(0xF)
        a_hi = sc_hi & np.uint8(0xF)
        dst = _U(32 * b)
        for l in range(16):  # fold the 4-bit sub-block scale in: 3 * 15 fits a byte
            q[dst + _U(l)] = ((row[src + _U(l)] >> sh) & np.uint8(3)) * a_lo
        for l in range(16, 32):
            q[dst + _U(l)] = ((row[src + _U(l)] >> sh) & np.uint8(3)) * a_hi
        ws[b] = d
        wm[2 * b] = dmin * np.float32(sc_lo >> np.uint8(4))
        wm[2 * b + 1] = dmin * np.float32(sc_hi >> np.uint8(4))


@nb.njit(cache=True, nogil=True, inline="always")
def _q3_k_scale(row, io, i):
    """6-bit sub-block scale i of the Q3_K block at int offset io, minus 32 (-32..31)."""
    lo = (np.int32(row[io + 96 + i % 8]) >> (4 * (i // 8))) & 0xF
    hi = (np.int32(row[io + 104 + i % 4]) >> (2 * (i // 4))) & 3
    return (lo | (hi << 4)) - 32


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_q3_k(row, o, q, ws, wm):
    # hmask[32] | qs[64] | scales[12] | d; value = (u - 4) * sc with u = 2 low bits + 4 * hmask bit.
    # (u - 4) * sc = u' * |sc| - c * |sc| where u' = u, c = 4 for sc >= 0 and u' = 7 - u, c = 3
    # otherwise: u' * |sc| <= 7 * 32 fits a byte, so the scale folds into the weights.
    io = np.int64(o)
    d = f16_at(row, io + 108)
    for b in range(NBLK):
        src = o + _U(32 + 32 * (b // 4))
        sh = np.uint8(2 * (b % 4))
        bit = np.uint8(b)
        for half in range(2):
            sc = _q3_k_scale(row, io, 2 * b + half)
            flip = np.uint8(7) if sc < 0 else np.uint8(0)  # 7 - u == u ^ 7 for u in 0..7
            a = np.uint8(-sc if sc < 0 else sc)
            dst = _U(32 * b + 16 * half)
            for l in range(16):
                e = _U(16 * half + l)
                u = ((row[src + e] >> sh) & np.uint8(3)) | (((row[o + e] >> bit) & np.uint8(1)) << np.uint8(2))
                q[dst + _U(l)] = (u ^ flip) * a
            wm[2 * b + half] = d * np.float32(a) * np.float32(3.0 if sc < 0 else 4.0)
        ws[b] = d


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_iq4_xs(row, o, q, ws, wm, levels):
    # d | scales_h u16 | scales_l[4] | qs[128]; 32-block b: low nibbles of qs[16b:16b+16], then high
    io = np.int64(o)
    d = f16_at(row, io)
    sh = np.int32(row[io + 2]) | (np.int32(row[io + 3]) << 8)
    for b in range(NBLK):
        src = o + _U(8 + 16 * b)
        dst = _U(32 * b)
        for l in range(16):
            v = row[src + _U(l)]
            q[dst + _U(l)] = levels[v & np.uint8(0xF)]
            q[dst + _U(16 + l)] = levels[v >> np.uint8(4)]
        ls = ((np.int32(row[io + 4 + b // 2]) >> (4 * (b % 2))) & 0xF) | (((sh >> (2 * b)) & 3) << 4)
        s = d * np.float32(ls - 32)
        ws[b] = s
        wm[2 * b] = np.float32(128.0) * s  # levels were shifted by +128
        wm[2 * b + 1] = wm[2 * b]


@nb.njit(cache=True, nogil=True, inline="always")
def decode_superblock(qt, row, o, q, ws, wm, levels):
    """Superblock of type code qt (Q2_K, Q3_K or IQ4_XS) at byte o (uint64) of row ->
    q uint8 [256], ws float32 [8] per-32 scales, wm float32 [16] per-16 offsets (see above)."""
    if qt == Q2_K:
        _decode_q2_k(row, o, q, ws, wm)
    elif qt == Q3_K:
        _decode_q3_k(row, o, q, ws, wm)
    else:
        _decode_iq4_xs(row, o, q, ws, wm, levels)
