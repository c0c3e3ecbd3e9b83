"""Per-type device decoders of GGUF blocks, in the form every integer kernel uses.

A row's weights are w_e = s · u_e + c with u_e an unsigned integer and (s, c) float32 per block
of 32 (per half-block of 16 for Q2_K, Q3_K, Q6_K), exactly the (u, s, c) the CPU kernels fold
(backends/cpu/legacy_blocks.py, kquant_unpack.py):

    load4(w, r, b, g) -> (u0, u1, u2, u3)   int32 weights 4g .. 4g+3 of 32-block b of row r
    scales(w, r, b, h) -> (s, c)            float32 scale and bias of 32-block b (its half h for
                                            the per-16 types; h is ignored otherwise)

w is the uint8 [m, row_bytes] device matrix of raw blocks; b counts 32-element blocks from the
start of the row (a 256-element superblock holds eight). DECODERS maps each type to its
(load4, scales, family); the family picks the matmul's per-block float formula (matmul_int.py).
"""

import math

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, int32

LEGACY, K32, K16 = 0, 1, 2  # block families: 32-blocks with (d, c); K-quants per-32; K-quants per-16

# IQ4_NL / IQ4_XS codebook + 128 (unsigned), as the CPU kernels use it
IQ4_U8 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32) + 128


@cuda.jit(device=True, inline=True)
def _float_from_bits(h, mbits, emax, bias):
    """float32 of a 16-bit IEEE-style pattern h with mbits mantissa bits, exponent field all-ones
    emax and exponent bias `bias` (sign in bit 15), exact."""
    e = (h >> mbits) & emax
    m = h & ((1 << mbits) - 1)
    if e == 0:
        v = float32(math.ldexp(float32(m), 1 - bias - mbits))
    elif e == emax:
        v = float32(math.inf) if m == 0 else float32(math.nan)
    else:
        v = float32(math.ldexp(float32(m + (1 << mbits)), int(e - bias - mbits)))
    if h & 0x8000:
        v = -v
    return v


@cuda.jit(device=True, inline=True)
def f16_from_bits(h):
    """float32 of the IEEE binary16 bit pattern h (an int in 0..65535), exact."""
    return _float_from_bits(h, 10, 31, 15)


@cuda.jit(device=True, inline=True)
def bf16_from_bits(h):
    """float32 of the bfloat16 bit pattern h (an int in 0..65535), exact."""
    return _float_from_bits(h, 7, 255, 127)


@cuda.jit(device=True, inline=True)
def f16_at(w, r, o):
    """float32 of the little-endian fp16 at byte o of row r."""
    return f16_from_bits(int32(w[r, o]) | (int32(w[r, o + 1]) << 8))


@cuda.jit(device=True, inline=True)
def _u8(w, r, o):
    return int32(w[r, o])


# ------------------------------------------------------------------ 32-element block types


@cuda.jit(device=True, inline=True)
def _offset_scales(w, r, o, zero):
    """(s, c) = (d, zero · d) for the fp16 scale d at byte o: w = d · (u + zero) for the types
    without a stored bias (Q4_0, Q5_0, Q8_0, IQ4_NL), whose unsigned quants u center on -zero."""
    d = f16_at(w, r, o)
    return d, float32(zero) * d


@cuda.jit(device=True, inline=True)
def q8_0_load4(w, r, b, g):
    o = b * 34 + 2 + 4 * g  # int8 q read as q ^ 0x80 = q + 128
    return _u8(w, r, o) ^ 128, _u8(w, r, o + 1) ^ 128, _u8(w, r, o + 2) ^ 128, _u8(w, r, o + 3) ^ 128


@cuda.jit(device=True, inline=True)
def q8_0_scales(w, r, b, h):
    return _offset_scales(w, r, b * 34, -128.0)


@cuda.jit(device=True, inline=True)
def _nib4(w, r, o, g):
    """Four nibbles of a 16-byte qs field at byte o: elements 0-15 low nibbles, 16-31 high."""
    q = o + 4 * (g & 3)
    s = 4 * (g >> 2)
    return (_u8(w, r, q) >> s) & 15, (_u8(w, r, q + 1) >> s) & 15, (_u8(w, r, q + 2) >> s) & 15, (_u8(w, r, q + 3) >> s) & 15


@cuda.jit(device=True, inline=True)
def _hi4(w, r, o, g):
    """Fifth bits (as 16s) of elements 4g .. 4g+3 from the little-endian u32 qh at byte o."""
    v = _u8(w, r, o + (g >> 1)) >> (4 * (g & 1))
    return (v & 1) << 4, ((v >> 1) & 1) << 4, ((v >> 2) & 1) << 4, ((v >> 3) & 1) << 4


@cuda.jit(device=True, inline=True)
def q4_0_load4(w, r, b, g):
    return _nib4(w, r, b * 18 + 2, g)


@cuda.jit(device=True, inline=True)
def q4_0_scales(w, r, b, h):
    return _offset_scales(w, r, b * 18, -8.0)


@cuda.jit(device=True, inline=True)
def q4_1_load4(w, r, b, g):
    return _nib4(w, r, b * 20 + 4, g)


@cuda.jit(device=True, inline=True)
def q4_1_scales(w, r, b, h):
    return f16_at(w, r, b * 20), f16_at(w, r, b * 20 + 2)


@cuda.jit(device=True, inline=True)
def _nib5(w, r, qs, qh, g):
    """Five-bit quants of elements 4g .. 4g+3: nibbles from the qs field at byte qs, fifth bits
    from the u32 qh at byte qh."""
    a0, a1, a2, a3 = _nib4(w, r, qs, g)
    h0, h1, h2, h3 = _hi4(w, r, qh, g)
    return a0 | h0, a1 | h1, a2 | h2, a3 | h3


@cuda.jit(device=True, inline=True)
def q5_0_load4(w, r, b, g):
    return _nib5(w, r, b * 22 + 6, b * 22 + 2, g)


@cuda.jit(device=True, inline=True)
def q5_0_scales(w, r, b, h):
    return _offset_scales(w, r, b * 22, -16.0)


@cuda.jit(device=True, inline=True)
def q5_1_load4(w, r, b, g):
    return _nib5(w, r, b * 24 + 8, b * 24 + 4, g)


@cuda.jit(device=True, inline=True)
def q5_1_scales(w, r, b, h):
    return f16_at(w, r, b * 24), f16_at(w, r, b * 24 + 2)


@cuda.jit(device=True, inline=True)
def iq4_nl_load4(w, r, b, g):
    a0, a1, a2, a3 = _nib4(w, r, b * 18 + 2, g)
    lut = IQ4_U8
    return lut[a0], lut[a1], lut[a2], lut[a3]


@cuda.jit(device=True, inline=True)
def iq4_nl_scales(w, r, b, h):
    return _offset_scales(w, r, b * 18, -128.0)


# ------------------------------------------------------------------ K-quants (256-element superblocks)


@cuda.jit(device=True, inline=True)
def _q4k_nib4(w, r, o, j, g):
    """Elements 4g .. 4g+3 of 32-block j from the 128-byte qs at byte o (pairs of blocks share
    32 bytes: low nibbles for even j, high for odd)."""
    q = o + 32 * (j >> 1) + 4 * g
    s = 4 * (j & 1)
    return (_u8(w, r, q) >> s) & 15, (_u8(w, r, q + 1) >> s) & 15, (_u8(w, r, q + 2) >> s) & 15, (_u8(w, r, q + 3) >> s) & 15


@cuda.jit(device=True, inline=True)
def q4_k_load4(w, r, b, g):
    return _q4k_nib4(w, r, (b >> 3) * 144 + 16, b & 7, g)


@cuda.jit(device=True, inline=True)
def _q4k_scales_at(w, r, base, j):
    """(d · scale_j, -dmin · min_j) of a Q4_K / Q5_K superblock at byte base (6-bit packed pairs)."""
    d = f16_at(w, r, base)
    dmin = f16_at(w, r, base + 2)
    o = base + 4
    if j < 4:
        sc = _u8(w, r, o + j) & 63
        mn = _u8(w, r, o + j + 4) & 63
    else:
        sc = (_u8(w, r, o + j + 4) & 15) | ((_u8(w, r, o + j - 4) >> 6) << 4)
        mn = (_u8(w, r, o + j + 4) >> 4) | ((_u8(w, r, o + j) >> 6) << 4)
    return float32(sc) * d, float32(mn) * (-dmin)


@cuda.jit(device=True, inline=True)
def q4_k_scales(w, r, b, h):
    return _q4k_scales_at(w, r, (b >> 3) * 144, b & 7)


@cuda.jit(device=True, inline=True)
def _plane_bit4(a0, a1, a2, a3, w, r, o, j, shift):
    """a_l | (bit j of byte o + l) << shift for l = 0..3: a high bit of elements 4g .. 4g+3 from a
    bit plane (Q5_K qh, Q3_K hmask) whose byte l holds bit j for element l of 32-block j."""
    return (a0 | (((_u8(w, r, o) >> j) & 1) << shift), a1 | (((_u8(w, r, o + 1) >> j) & 1) << shift),
            a2 | (((_u8(w, r, o + 2) >> j) & 1) << shift), a3 | (((_u8(w, r, o + 3) >> j) & 1) << shift))


@cuda.jit(device=True, inline=True)
def q5_k_load4(w, r, b, g):
    base = (b >> 3) * 176
    j = b & 7
    a0, a1, a2, a3 = _q4k_nib4(w, r, base + 48, j, g)
    return _plane_bit4(a0, a1, a2, a3, w, r, base + 16 + 4 * g, j, 4)


@cuda.jit(device=True, inline=True)
def q5_k_scales(w, r, b, h):
    return _q4k_scales_at(w, r, (b >> 3) * 176, b & 7)


@cuda.jit(device=True, inline=True)
def iq4_xs_load4(w, r, b, g):
    j = b & 7
    a0, a1, a2, a3 = _nib4(w, r, (b >> 3) * 136 + 8 + 16 * j, g)
    lut = IQ4_U8
    return lut[a0], lut[a1], lut[a2], lut[a3]


@cuda.jit(device=True, inline=True)
def iq4_xs_scales(w, r, b, h):
    base = (b >> 3) * 136
    j = b & 7
    d = f16_at(w, r, base)
    lo = (_u8(w, r, base + 4 + (j >> 1)) >> (4 * (j & 1))) & 15
    hi = ((_u8(w, r, base + 2) | (_u8(w, r, base + 3) << 8)) >> (2 * j)) & 3
    s = float32((lo | (hi << 4)) - 32) * d
    return s, s * float32(-128.0)


@cuda.jit(device=True, inline=True)
def q6_k_load4(w, r, b, g):
    base = (b >> 3) * 210
    j = b & 7
    h = j >> 2  # 128-element half of the superblock
    qd = j & 3  # 32-element quarter within it
    ql = base + 64 * h + 32 * (qd & 1) + 4 * g
    qh = base + 128 + 32 * h + 4 * g
    s1 = 4 * (qd >> 1)
    s2 = 2 * qd
    return (((_u8(w, r, ql) >> s1) & 15) | (((_u8(w, r, qh) >> s2) & 3) << 4),
            ((_u8(w, r, ql + 1) >> s1) & 15) | (((_u8(w, r, qh + 1) >> s2) & 3) << 4),
            ((_u8(w, r, ql + 2) >> s1) & 15) | (((_u8(w, r, qh + 2) >> s2) & 3) << 4),
            ((_u8(w, r, ql + 3) >> s1) & 15) | (((_u8(w, r, qh + 3) >> s2) & 3) << 4))


@cuda.jit(device=True, inline=True)
def q6_k_scales(w, r, b, h):
    base = (b >> 3) * 210
    i = 2 * (b & 7) + h  # 16-element group within the superblock
    sc = _u8(w, r, base + 192 + i)
    if sc >= 128:
        sc -= 256  # int8
    s = float32(sc) * f16_at(w, r, base + 208)
    return s, s * float32(-32.0)


@cuda.jit(device=True, inline=True)
def _low2(w, r, o, j, g):
    """2-bit quants of elements 4g .. 4g+3 of 32-block j from a 64-byte qs field at byte o."""
    q = o + 32 * (j >> 2) + 4 * g
    s = 2 * (j & 3)
    return (_u8(w, r, q) >> s) & 3, (_u8(w, r, q + 1) >> s) & 3, (_u8(w, r, q + 2) >> s) & 3, (_u8(w, r, q + 3) >> s) & 3


@cuda.jit(device=True, inline=True)
def q3_k_load4(w, r, b, g):
    base = (b >> 3) * 110
    j = b & 7
    a0, a1, a2, a3 = _low2(w, r, base + 32, j, g)
    return _plane_bit4(a0, a1, a2, a3, w, r, base + 4 * g, j, 2)


@cuda.jit(device=True, inline=True)
def q3_k_scales(w, r, b, h):
    base = (b >> 3) * 110
    i = 2 * (b & 7) + h
    lo = (_u8(w, r, base + 96 + (i & 7)) >> (4 * (i >> 3))) & 15
    hi = (_u8(w, r, base + 104 + (i & 3)) >> (2 * (i >> 2))) & 3
    s = float32((lo | (hi << 4)) - 32) * f16_at(w, r, base + 108)
    return s, s * float32(-4.0)


@cuda.jit(device=True, inline=True)
def q2_k_load4(w, r, b, g):
    return _low2(w, r, (b >> 3) * 84 + 16, b & 7, g)


@cuda.jit(device=True, inline=True)
def q2_k_scales(w, r, b, h):
    base = (b >> 3) * 84
    v = _u8(w, r, base + 2 * (b & 7) + h)
    return float32(v & 15) * f16_at(w, r, base + 80), float32(v >> 4) * (-f16_at(w, r, base + 82))


# qtype -> (load4, scales, family)
DECODERS = {
    T.Q4_0: (q4_0_load4, q4_0_scales, LEGACY),
    T.Q4_1: (q4_1_load4, q4_1_scales, LEGACY),
    T.Q5_0: (q5_0_load4, q5_0_scales, LEGACY),
    T.Q5_1: (q5_1_load4, q5_1_scales, LEGACY),
    T.Q8_0: (q8_0_load4, q8_0_scales, LEGACY),
    T.IQ4_NL: (iq4_nl_load4, iq4_nl_scales, LEGACY),
    T.Q2_K: (q2_k_load4, q2_k_scales, K16),
    T.Q3_K: (q3_k_load4, q3_k_scales, K16),
    T.Q4_K: (q4_k_load4, q4_k_scales, K32),
    T.Q5_K: (q5_k_load4, q5_k_scales, K32),
    T.Q6_K: (q6_k_load4, q6_k_scales, K16),
    T.IQ4_XS: (iq4_xs_load4, iq4_xs_scales, K32),
}
