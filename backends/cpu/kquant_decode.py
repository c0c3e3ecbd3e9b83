"""Scalar superblock decoder for the K-quant-family type without hand-written vector code:
IQ4_XS (Q2_K .. Q6_K are in kquant_simd.py).

It turns one 256-element superblock into *unsigned* bytes q[256] plus float scales, so the
integer dot is u8 × i8 → int32:
    w_e = ws[b] · q_e - wm[h]   for 32-block b = e // 32 and 16-half h = e // 16
(wm: the +128 shift of the non-linear levels).
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
    """Superblock of type code qt (IQ4_XS, the one type still decoded here) at byte o (uint64)
    of row -> q uint8 [256], ws float32 [8] per-32 scales, wm float32 [16] per-16 offsets."""
    _decode_iq4_xs(row, o, q, ws, wm, levels)
