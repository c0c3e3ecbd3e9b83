"""K-quant (Q2_K .. Q6_K) and IQ4_XS superblocks unpacked in registers, and the table of types.

Every unpacker emits IR for one 256-element superblock at i8* bp: `quants(builder, bp, j)` the 64
unsigned weight bytes of chunk j (0..3), `scales(builder, bp)` float32 (s, c) per 32-block ([8])
or per 16 ([16]) with w_e = s · u_e + c. The per-32 types also have a gemv-layout variant (_il)
that the activations are permuted alike for (kquant_gemv.interleave_blocks). TYPES lists, per
kind, what kquant_decode (gemm rows) and kquant_gemv need.
"""

from functools import partial

from llvmlite import ir

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.vector_ir import (
    F32, I8, I16, I32, V4I32, V8F, V8I32, V16F, V16I8, V16I32, V32I8, V32I16, V64I8, const, f16_to_f32,
    iq4_lookup, load, shuf, splat, vec,
)

# Type kinds: one compiled gemv and one compiled gemm serve every type, `kind` picks the unpacker.
KIND_Q4K, KIND_Q6K, KIND_IQ4XS, KIND_Q5K, KIND_Q3K, KIND_Q2K = 0, 1, 2, 3, 4, 5
# Q4_K / Q5_K in the CPU's pair layout, whose copy also repacks qs (kquant_pairs.pack_nibbles)
KIND_Q4KP, KIND_Q5KP = 6, 7


def _bcast32(builder, p, boff):
    """A 32-byte load repeated in both halves of a 64-byte vector."""
    v = load(builder, p, boff, V32I8)
    return shuf(builder, v, list(range(32)) * 2)


def _lshr8(builder, v, shifts):
    """v (64 x i8) shifted right as 16-bit lanes by shifts (32 per-lane counts); callers mask."""
    s = builder.lshr(builder.bitcast(v, V32I16), const(V32I16, shifts))
    return builder.bitcast(s, V64I8)


def _shl8(builder, v, shifts):
    s = builder.shl(builder.bitcast(v, V32I16), const(V32I16, shifts))
    return builder.bitcast(s, V64I8)



# ------------------------------------------------------------------------------- Q4_K, Q5_K, IQ4_XS (per-32 scales)


Q4K_BYTES = 144  # d f16 | dmin f16 | scales[12] | qs[128]
Q5K_BYTES = 176  # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
Q6K_BYTES = 210  # ql[128] | qh[64] | scales[16] int8 | d f16
Q3K_BYTES = 110  # hmask[32] | qs[64] | scales[12] | d f16
Q2K_BYTES = 84  # scales[16] | qs[64] | d f16 | dmin f16
IQ4XS_BYTES = 136  # d f16 | scales_h u16 | scales_l[4] | qs[128]


def _q4k_scales(builder, bp):
    """(d · scale[0:8], -dmin · min[0:8]) as float32 vectors of 8, from one Q4_K/Q5_K block at bp.

    The 12-byte field packs eight 6-bit (scale, min) pairs: pairs 0-3 in the low 6 bits of bytes
    0-3 / 4-7, pairs 4-7 as nibbles of bytes 8-11 plus the top 2 bits of bytes 0-3 / 4-7. The
    four result words (scales 0-3, 4-7, mins 0-3, 4-7) are unpacked in the lanes of one vector."""
    c4 = lambda vals: const(V4I32, vals)  # noqa: E731
    v = load(builder, bp, 0, V4I32)  # [d | dmin, a0, a1, a2]
    p = shuf(builder, v, (1, 3, 2, 3))  # [a0, a2, a1, a2]
    q = shuf(builder, v, (1, 1, 2, 2))  # [a0, a0, a1, a1]: top 2 bits of pairs 4-7
    lo = builder.and_(builder.lshr(p, c4([0, 0, 0, 4])), c4([0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F]))
    hi = builder.shl(builder.and_(builder.lshr(q, c4(6)), c4([0, 0x03030303, 0, 0x03030303])), c4(4))
    b16 = builder.bitcast(builder.or_(lo, hi), V16I8)
    dd = builder.extract_element(v, ir.Constant(I32, 0))
    if vir.USE_F16C:
        dm = builder.fpext(builder.bitcast(dd, vec(ir.HalfType(), 2)), vec(F32, 2))
        d = builder.extract_element(dm, ir.Constant(I32, 0))
        dmin = builder.extract_element(dm, ir.Constant(I32, 1))
    else:
        d = f16_to_f32(builder, builder.trunc(dd, I16))
        dmin = f16_to_f32(builder, builder.trunc(builder.lshr(dd, ir.Constant(I32, 16)), I16))
    sc = builder.uitofp(builder.zext(shuf(builder, b16, range(8)), V8I32), V8F)
    mn = builder.uitofp(builder.zext(shuf(builder, b16, range(8, 16)), V8I32), V8F)
    return builder.fmul(sc, splat(builder, d, V8F)), builder.fmul(mn, splat(builder, builder.fneg(dmin), V8F))


def _q4k_nibbles(builder, bp, j, q5, packed=False):
    """64 unsigned weights (elements 64j .. 64j+63 of the superblock) from qs[32j : 32j+32]:
    low nibbles first (32-block 2j), then high nibbles (32-block 2j+1). Q5_K (q5) adds the fifth
    bit of 32-block b, bit b of qh[l] (qh[32] sits before qs). packed: qs as pack_nibbles leaves
    it, 32-blocks 2j, 2j+1 in qs[32j : 32j+16], qs[32j+16 : 32j+32]."""
    if packed:
        v = shuf(builder, load(builder, bp, (48 if q5 else 16) + 32 * j, V32I8),
                 list(range(16)) * 2 + list(range(16, 32)) * 2)
        v = builder.and_(_lshr8(builder, v, ([0] * 8 + [4] * 8) * 2), const(V64I8, 0x0F))
    else:
        v = _bcast32(builder, bp, (48 if q5 else 16) + 32 * j)
        v = builder.and_(_lshr8(builder, v, [0] * 16 + [4] * 16), const(V64I8, 0x0F))
    if q5:
        h = _lshr8(builder, _bcast32(builder, bp, 16), [2 * j] * 16 + [2 * j + 1] * 16)
        h = _shl8(builder, builder.and_(h, const(V64I8, 0x01)), [4] * 32)
        v = builder.or_(v, h)
    return v


def _iq4xs_quants(builder, bp, j):
    """64 unsigned weights (codebook level + 128) of 32-blocks 2j, 2j+1: block b's 16 bytes
    qs[16b : 16b+16] give elements 0-15 (low nibbles) then 16-31 (high nibbles)."""
    v = load(builder, bp, 8 + 32 * j, V32I8)
    v = shuf(builder, v, list(range(16)) * 2 + list(range(16, 32)) * 2)
    nib = builder.and_(_lshr8(builder, v, ([0] * 8 + [4] * 8) * 2), const(V64I8, 0x0F))
    return iq4_lookup(builder, nib)


def _iq4xs_scales(builder, bp):
    """(s, c) float32 [8]: s_b = d · (6-bit scale - 32), low 4 bits from nibble b of bytes 4-7,
    top 2 from bits 2b of the u16 at byte 2; c = -128 · s (the levels' +128 shift)."""
    d = f16_to_f32(builder, load(builder, bp, 0, I16))
    sl = splat(builder, load(builder, bp, 4, I32), V8I32)
    sh = splat(builder, builder.zext(load(builder, bp, 2, I16), I32), V8I32)
    lo = builder.and_(builder.lshr(sl, const(V8I32, [4 * b for b in range(8)])), const(V8I32, 0x0F))
    hi = builder.and_(builder.lshr(sh, const(V8I32, [2 * b for b in range(8)])), const(V8I32, 3))
    ls = builder.sub(builder.or_(lo, builder.shl(hi, const(V8I32, 4))), const(V8I32, 32))
    s8 = builder.fmul(builder.sitofp(ls, V8F), splat(builder, d, V8F))
    return s8, builder.fmul(s8, splat(builder, ir.Constant(F32, -128.0), V8F))


# gemv layout of the per-32 types: superblock chunk j = 2h + e (64 bytes) holds elements
# 16e .. 16e+15 of blocks 4h .. 4h+3, 16 bytes per block, so two vpdpbusd accumulate four blocks in
# disjoint lanes and one halving less sums them (activations permuted alike: interleave_blocks).
_IL_SHIFT = ([0] * 8 + [4] * 8) * 2  # per 16-bit lane: low nibbles in 128-bit lanes 0, 2; high in 1, 3


def _q4k_il(builder, bp, j, q5, packed=False):
    """Chunk j = 2h + e of one Q4_K (Q5_K: q5) superblock in the gemv layout. Blocks 4h, 4h+1 are
    the low / high nibbles of qs[64h : 64h+32], blocks 4h+2, 4h+3 those of qs[64h+32 : 64h+64];
    Q5_K adds bit b of qh[l] as the fifth bit of element l of block b. packed (pack_nibbles' qs):
    the chunk is nibble e of qs[64h : 64h+64] as it stands, no lane shuffle."""
    h, e = divmod(j, 2)
    v = load(builder, bp, (48 if q5 else 16) + 64 * h, V64I8)
    if packed:
        v = builder.and_(_lshr8(builder, v, [4 * e] * 32), const(V64I8, 0x0F))
    else:
        v = shuf(builder, v, [16 * lane + i for lane in (e, e, 2 + e, 2 + e) for i in range(16)])
        v = builder.and_(_lshr8(builder, v, _IL_SHIFT), const(V64I8, 0x0F))
    if q5:
        qh = shuf(builder, load(builder, bp, 16 + 16 * e, V16I8), list(range(16)) * 4)
        qh = _lshr8(builder, qh, [4 * h + i for i in range(4) for _ in range(8)])
        v = builder.or_(v, _shl8(builder, builder.and_(qh, const(V64I8, 0x01)), [4] * 32))
    return v


def _iq4xs_quants_il(builder, bp, j):
    """Chunk j = 2h + e of one IQ4_XS superblock in the gemv layout: block b is qs[16b : 16b+16],
    low nibbles elements 0-15, high nibbles 16-31."""
    h, e = divmod(j, 2)
    v = load(builder, bp, 8 + 64 * h, V64I8)
    nib = builder.and_(_lshr8(builder, v, [4 * e] * 32), const(V64I8, 0x0F))
    return iq4_lookup(builder, nib)



# ------------------------------------------------------------------------------- Q6_K, Q3_K, Q2_K (per-16 scales)


def _q6k_quants(builder, bp, c):
    """64 unsigned 6-bit weights (elements 64c .. 64c+63) of one Q6_K block: low 4 bits from
    ql[64h : 64h+64] (h = c // 2; low nibbles for even c, high for odd), the top 2 bits from
    qh[32h : 32h+32] (bit pairs 0-1, 2-3 for even c, 4-5, 6-7 for odd c)."""
    h, odd = divmod(c, 2)
    ql = load(builder, bp, 64 * h, V64I8)
    qh = _bcast32(builder, bp, 128 + 32 * h)
    m30, m0f = const(V64I8, 0x30), const(V64I8, 0x0F)
    if odd:
        hi = builder.and_(_lshr8(builder, qh, [0] * 16 + [2] * 16), m30)
        lo = builder.and_(_lshr8(builder, ql, [4] * 32), m0f)
    else:
        hi = builder.and_(_shl8(builder, qh, [4] * 16 + [2] * 16), m30)
        lo = builder.and_(ql, m0f)
    return builder.or_(lo, hi)


def _q6k_scales(builder, bp):
    """(s, c) float32 [16] per-16 scales d · scales[i] (int8) and biases -32 · s."""
    d = f16_to_f32(builder, load(builder, bp, 208, I16))
    sc = builder.sitofp(builder.sext(load(builder, bp, 192, V16I8), V16I32), V16F)
    s16 = builder.fmul(sc, splat(builder, d, V16F))
    return s16, builder.fmul(s16, splat(builder, ir.Constant(F32, -32.0), V16F))


def _low2(builder, bp, qs_off, c):
    """Q2_K/Q3_K 2-bit quants of elements 64c .. 64c+63: element e takes bits 2·((e%128)//32)
    of qs[32·(e//128) + e%32] (qs at byte qs_off)."""
    h, i = divmod(c, 2)
    v = _lshr8(builder, _bcast32(builder, bp, qs_off + 32 * h), [4 * i] * 16 + [4 * i + 2] * 16)
    return builder.and_(v, const(V64I8, 0x03))


def _q3k_quants(builder, bp, c):
    """64 unsigned 3-bit weights (elements 64c .. 64c+63) of one Q3_K block (value u - 4): 2 low
    bits from qs (at byte 32), the third from bit e//32 of hmask[e%32] (at byte 0)."""
    hb = _lshr8(builder, _bcast32(builder, bp, 0), [2 * c] * 16 + [2 * c + 1] * 16)
    hb = _shl8(builder, builder.and_(hb, const(V64I8, 0x01)), [2] * 32)
    return builder.or_(_low2(builder, bp, 32, c), hb)


def _q3k_scales(builder, bp):
    """(s, c) float32 [16]: d · (6-bit scale - 32) and -4 · s. Scale i: low 4 bits from byte
    96 + i%8 (low nibble for i < 8, high otherwise), top 2 bits from byte 104 + i%4, bits 2·(i//4)."""
    d = f16_to_f32(builder, load(builder, bp, 108, I16))
    a = load(builder, bp, 96, vec(I8, 8))
    a16 = builder.zext(shuf(builder, a, list(range(8)) * 2), V16I32)
    lo = builder.and_(builder.lshr(a16, const(V16I32, [0] * 8 + [4] * 8)), const(V16I32, 0x0F))
    h = builder.zext(shuf(builder, load(builder, bp, 104, vec(I8, 4)), [i % 4 for i in range(16)]), V16I32)
    hi = builder.and_(builder.lshr(h, const(V16I32, [2 * (i // 4) for i in range(16)])), const(V16I32, 3))
    sc = builder.sub(builder.or_(lo, builder.shl(hi, const(V16I32, 4))), const(V16I32, 32))
    s16 = builder.fmul(builder.sitofp(sc, V16F), splat(builder, d, V16F))
    return s16, builder.fmul(s16, splat(builder, ir.Constant(F32, -4.0), V16F))


def _q2k_quants(builder, bp, c):
    """64 unsigned 2-bit weights (elements 64c .. 64c+63) of one Q2_K block (qs at byte 16)."""
    return _low2(builder, bp, 16, c)


def _q2k_scales(builder, bp):
    """(s, c) float32 [16]: d · (scales[i] & 15) and -dmin · (scales[i] >> 4)."""
    dd = load(builder, bp, 80, I32)
    d = f16_to_f32(builder, builder.trunc(dd, I16))
    dmin = f16_to_f32(builder, builder.trunc(builder.lshr(dd, ir.Constant(I32, 16)), I16))
    sc = builder.zext(load(builder, bp, 0, V16I8), V16I32)
    s16 = builder.fmul(builder.uitofp(builder.and_(sc, const(V16I32, 0x0F)), V16F), splat(builder, d, V16F))
    mn = builder.uitofp(builder.lshr(sc, const(V16I32, 4)), V16F)
    return s16, builder.fmul(mn, splat(builder, builder.fneg(dmin), V16F))


# kind -> (block bytes, gemv-layout quants, quants, scales, family). Families: "s32" per-32 scales
# and biases; "s16" per-16 scales and biases; "s16i" per-16 scales with c = -B·s folded into the
# integer dots (Q6_K B = 32, Q3_K B = 4).
TYPES = {
    KIND_Q4K: (Q4K_BYTES, partial(_q4k_il, q5=False), partial(_q4k_nibbles, q5=False), _q4k_scales, "s32"),
    KIND_Q5K: (Q5K_BYTES, partial(_q4k_il, q5=True), partial(_q4k_nibbles, q5=True), _q4k_scales, "s32"),
    KIND_IQ4XS: (IQ4XS_BYTES, _iq4xs_quants_il, _iq4xs_quants, _iq4xs_scales, "s32"),
    KIND_Q6K: (Q6K_BYTES, _q6k_quants, _q6k_quants, _q6k_scales, "s16i"),
    KIND_Q3K: (Q3K_BYTES, _q3k_quants, _q3k_quants, _q3k_scales, "s16i"),
    KIND_Q2K: (Q2K_BYTES, _q2k_quants, _q2k_quants, _q2k_scales, "s16"),
    KIND_Q4KP: (Q4K_BYTES, partial(_q4k_il, q5=False, packed=True), partial(_q4k_nibbles, q5=False, packed=True),
                _q4k_scales, "s32"),
    KIND_Q5KP: (Q5K_BYTES, partial(_q4k_il, q5=True, packed=True), partial(_q4k_nibbles, q5=True, packed=True),
                _q4k_scales, "s32"),
}
