"""Hand-written vector code (LLVM IR intrinsics) for the K-quant (Q2_K .. Q6_K) and IQ4_XS matmuls.

LLVM does not find a good schedule for K-quant superblocks on its own (nibble unpacking, per-32
scales, 6-bit scale fields), so these intrinsics spell it out on whole 64-byte vectors:

- gemv (small n): `rows_dot` computes two rows × 1, 2 or 4 tokens. Each superblock of the two
  rows is unpacked once in registers (never stored) and multiplied, for every token, as unsigned
  bytes by the signed activation bytes with one `vpdpbusd` per 64 elements; the int32 lanes are
  summed exactly into per-block (per-16 for Q6_K/Q3_K/Q2_K) dots, and the two rows' float work
  shares 16-lane vectors. Per-32 types use a gemv layout of 4 blocks per vector (_q4k_il; the
  activations permuted alike by `interleave_blocks`), so two vpdpbusd accumulate 4 blocks.
- gemm (16- or 8-token tiles): `<type>_decode_row` unpack one row once into unsigned bytes u [k]
  and float scales / biases; `tile_dot` multiplies TILE_ROWS such rows by a tile of 4-interleaved
  activations ([k/32][8 groups][tokens][4 bytes]) with broadcast weight words, tokens in the
  lanes of one zmm (16) or ymm (8: same cost per token on hosts that split 512-bit ops), no
  horizontal sums; each activation vector load serves all TILE_ROWS rows.
Measured on the 2-core Zen 5 host (loops of independent ops, 2026-11-30): two pipes issue
vpdpbusd, ~8.4 a ns a core whether zmm or ymm, and float multiplies, cross-lane permutes
(vpermt2d) and 64-bit rotates take the same pipes, while adds, conversions,
in-lane shuffles, blends and broadcast loads do not; so a tile costs about its vpdpbusd +
multiplies, and an 8-token ymm tile costs nearly a 16-token one. (An 8-token tile with token t in
zmm lanes 2t, 2t+1 was ~0.8x at n = 8 but ~1.2x at n >= 16 for the per-32 types, as its float
work is duplicated in both lanes: not kept.)

Batch invariance: a token's output must not depend on the kernel its batch size picks, so gemv
and gemm compute the same float operations in the same order per (row, token): the block term
(plain multiplies and adds, no FMA)
  per-32 types   w_b = float(S_b) · (xd_b · s_b) + c_b · (xd_b · X_b)
  Q6_K, Q3_K     w_b = xd_b · (float(lo - B·X_lo) · s_lo + float(hi - B·X_hi) · s_hi)   (c = -B·s)
  Q2_K           w_b = (float(lo) · (xd_b · s_lo) + float(hi) · (xd_b · s_hi)) + (c_lo · xd_b·X_lo + c_hi · xd_b·X_hi)
(S, lo, hi exact int32 dots, X activation sums), a pairwise tree over each superblock's 8 terms
((w0+w1)+(w2+w3))+((w4+w5)+(w6+w7)), and superblock sums added in sequence from 0.

All byte offsets are element offsets into C-contiguous arrays; nothing is bounds-checked (the
kernels in matmul_kquants.py own the shapes). On hosts without AVX-512 VNNI (decided at compile
time from `USE_VNNI`, which tests flip to exercise it) the dot is portable vector IR
(zext × sext, sums of 4 lanes) that LLVM lowers for any target.
Numba's on-disk cache keys on the content of the caller's file only (numba 0.68 hashes the
source; touching it does nothing): after editing this module, delete the matmul_kquants.* files
of edged's Numba cache dir, or its kernels keep the old code.
"""

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edged.backends.cpu.aligned import empty_aligned

# Read at codegen time; tests set them to False (and compile uncached) to run the portable paths.
USE_VNNI = bool(llvm.get_host_cpu_features().get("avx512vnni", False))
USE_F16C = bool(llvm.get_host_cpu_features().get("f16c", False))

TOKENS = 16  # tokens per gemm tile: one 512-bit vector of int32 / float32 lanes

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()


def _v(t, n):
    return ir.VectorType(t, n)


_V64I8, _V32I8, _V16I8 = _v(_I8, 64), _v(_I8, 32), _v(_I8, 16)
_V32I16 = _v(_I16, 32)
_V16I32, _V8I32, _V4I32 = _v(_I32, 16), _v(_I32, 8), _v(_I32, 4)
_V16F, _V8F = _v(_F32, 16), _v(_F32, 8)


# ------------------------------------------------------------------------------- IR helpers


def _base(context, builder, arrty, arr, off):
    """i8* to element `off` (an LLVM integer) of a C-contiguous array of any rank."""
    ary = context.make_array(arrty)(context, builder, arr)
    p = builder.gep(ary.data, [off])
    return builder.bitcast(p, _I8.as_pointer())


def _ld(builder, p, boff, ty, align=1):
    """Load a value of type `ty` from i8* p + boff bytes (boff a Python int or an LLVM i64)."""
    if isinstance(boff, int):
        boff = ir.Constant(_I64, boff)
    q = builder.bitcast(builder.gep(p, [boff]), ty.as_pointer())
    return builder.load(q, align=align)


def _st(builder, val, p, boff, align=1):
    if isinstance(boff, int):
        boff = ir.Constant(_I64, boff)
    builder.store(val, builder.bitcast(builder.gep(p, [boff]), val.type.as_pointer()), align=align)


def _splat(builder, x, vty):
    """Vector of type vty with every lane = scalar x."""
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), ir.Constant(_v(_I32, vty.count), [0] * vty.count))


def _const(vty, vals):
    return ir.Constant(vty, list(vals) if not isinstance(vals, int) else [vals] * vty.count)


def _shuf(builder, a, idx, b=None):
    idx = list(idx)
    return builder.shuffle_vector(a, b if b is not None else ir.Constant(a.type, ir.Undefined), ir.Constant(_v(_I32, len(idx)), idx))


def _halve(builder, a, b):
    """Lane i of the result = lanes 2i + 2i+1 of concat(a, b) (integer adds: exact)."""
    n = a.type.count
    ev = _shuf(builder, a, range(0, 2 * n, 2), b)
    od = _shuf(builder, a, range(1, 2 * n, 2), b)
    return builder.add(ev, od)


def _group_sums(builder, d, levels):
    """Four 16-lane int32 vectors (64 lanes in order) -> sums of consecutive lane groups of size
    2**levels, in order (levels 2: 16 sums of 4 lanes; 3: 8 sums of 8 lanes)."""
    f01, f23 = _halve(builder, d[0], d[1]), _halve(builder, d[2], d[3])
    g = _halve(builder, f01, f23)  # 16 lanes, groups of 2**levels / 4
    if levels == 3:
        g = _halve(builder, _shuf(builder, g, range(8)), _shuf(builder, g, range(8, 16)))
    return g


def _tree8(builder, w):
    """((w0 + w1) + (w2 + w3)) + ((w4 + w5) + (w6 + w7)) of an 8-lane float vector: the canonical
    order in which every kernel sums a superblock's 8 per-block terms (batch invariance)."""
    p = builder.fadd(_shuf(builder, w, (0, 2, 4, 6)), _shuf(builder, w, (1, 3, 5, 7)))
    q = builder.fadd(_shuf(builder, p, (0, 2)), _shuf(builder, p, (1, 3)))
    return builder.fadd(builder.extract_element(q, ir.Constant(_I32, 0)), builder.extract_element(q, ir.Constant(_I32, 1)))


def _f16(builder, h):
    """Exact float32 of the IEEE half bit pattern h (i16). With F16C an fpext (vcvtph2ps);
    otherwise integer ops (an fpext there may become a libcall Numba does not link): the bits
    shifted into float32 position and scaled by 2^112 (exact for normals and subnormals), with
    exponent 31 (inf / NaN) patched separately, as quant/f16.py does."""
    if USE_F16C:
        return builder.fpext(builder.bitcast(h, ir.HalfType()), _F32)
    h = builder.zext(h, _I32)
    sign = builder.shl(builder.and_(h, ir.Constant(_I32, 0x8000)), ir.Constant(_I32, 16))
    em = builder.shl(builder.and_(h, ir.Constant(_I32, 0x7FFF)), ir.Constant(_I32, 13))
    scaled = builder.fmul(builder.bitcast(em, _F32), ir.Constant(_F32, 2.0**112))
    special = builder.icmp_unsigned("==", builder.and_(h, ir.Constant(_I32, 0x7C00)), ir.Constant(_I32, 0x7C00))
    infnan = builder.or_(em, ir.Constant(_I32, 0x7F800000))
    bits = builder.select(special, infnan, builder.bitcast(scaled, _I32))
    return builder.bitcast(builder.or_(bits, sign), _F32)


def _dpbusd(builder, acc, w, x):
    """acc (16 or 8 x i32) + per-lane Σ of 4 products unsigned w bytes × signed x bytes (64 or 32
    x i8 each)."""
    lanes = acc.type.count
    vt = _v(_I32, lanes)
    if USE_VNNI:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vt, [vt] * 3), f"llvm.x86.avx512.vpdpbusd.{32 * lanes}")
        return builder.call(fn, [acc, builder.bitcast(w, vt), builder.bitcast(x, vt)])
    prod = builder.mul(builder.zext(w, _v(_I32, 4 * lanes)), builder.sext(x, _v(_I32, 4 * lanes)))
    for q in range(4):
        acc = builder.add(acc, _shuf(builder, prod, [4 * t + q for t in range(lanes)]))
    return acc


def _bcast32(builder, p, boff):
    """A 32-byte load repeated in both halves of a 64-byte vector."""
    v = _ld(builder, p, boff, _V32I8)
    return _shuf(builder, v, list(range(32)) * 2)


def _lshr8(builder, v, shifts):
    """v (64 x i8) shifted right as 16-bit lanes by shifts (32 per-lane counts); callers mask."""
    s = builder.lshr(builder.bitcast(v, _V32I16), _const(_V32I16, shifts))
    return builder.bitcast(s, _V64I8)


def _shl8(builder, v, shifts):
    s = builder.shl(builder.bitcast(v, _V32I16), _const(_V32I16, shifts))
    return builder.bitcast(s, _V64I8)


def _loop(builder, count, body, init):
    """for i in range(count) with loop-carried LLVM values (a list), returning their final values.
    Carried values live in allocas (promoted to registers by LLVM's mem2reg)."""
    slots = [cgutils.alloca_once_value(builder, v) for v in init]
    with cgutils.for_range(builder, count) as loop:
        vals = [builder.load(s) for s in slots]
        new = body(loop.index, vals)
        for s, v in zip(slots, new):
            builder.store(v, s)
    return [builder.load(s) for s in slots]


def _is_arr(t, dtype):
    return isinstance(t, types.Array) and t.dtype == dtype and t.layout == "C"


def _ints(*ts):
    return all(isinstance(t, types.Integer) for t in ts)


def _i64(context, builder, val, ty):
    return context.cast(builder, val, ty, types.int64)


# ------------------------------------------------------------------------------- Q4_K, Q5_K, IQ4_XS (per-32 scales)


Q4K_BYTES = 144  # d f16 | dmin f16 | scales[12] | qs[128]
Q5K_BYTES = 176  # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
Q6K_BYTES = 210  # ql[128] | qh[64] | scales[16] int8 | d f16
Q3K_BYTES = 110  # hmask[32] | qs[64] | scales[12] | d f16
Q2K_BYTES = 84  # scales[16] | qs[64] | d f16 | dmin f16


def _q4k_scales(builder, bp):
    """(d · scale[0:8], -dmin · min[0:8]) as float32 vectors of 8, from one Q4_K/Q5_K block at bp.

    The 12-byte field packs eight 6-bit (scale, min) pairs: pairs 0-3 in the low 6 bits of bytes
    0-3 / 4-7, pairs 4-7 as nibbles of bytes 8-11 plus the top 2 bits of bytes 0-3 / 4-7. The
    four result words (scales 0-3, 4-7, mins 0-3, 4-7) are unpacked in the lanes of one vector."""
    c4 = lambda vals: _const(_V4I32, vals)  # noqa: E731
    v = _ld(builder, bp, 0, _V4I32)  # [d | dmin, a0, a1, a2]
    p = _shuf(builder, v, (1, 3, 2, 3))  # [a0, a2, a1, a2]
    q = _shuf(builder, v, (1, 1, 2, 2))  # [a0, a0, a1, a1]: top 2 bits of pairs 4-7
    lo = builder.and_(builder.lshr(p, c4([0, 0, 0, 4])), c4([0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F]))
    hi = builder.shl(builder.and_(builder.lshr(q, c4(6)), c4([0, 0x03030303, 0, 0x03030303])), c4(4))
    b16 = builder.bitcast(builder.or_(lo, hi), _V16I8)
    dd = builder.extract_element(v, ir.Constant(_I32, 0))
    if USE_F16C:
        dm = builder.fpext(builder.bitcast(dd, _v(ir.HalfType(), 2)), _v(_F32, 2))
        d = builder.extract_element(dm, ir.Constant(_I32, 0))
        dmin = builder.extract_element(dm, ir.Constant(_I32, 1))
    else:
        d = _f16(builder, builder.trunc(dd, _I16))
        dmin = _f16(builder, builder.trunc(builder.lshr(dd, ir.Constant(_I32, 16)), _I16))
    sc = builder.uitofp(builder.zext(_shuf(builder, b16, range(8)), _V8I32), _V8F)
    mn = builder.uitofp(builder.zext(_shuf(builder, b16, range(8, 16)), _V8I32), _V8F)
    return builder.fmul(sc, _splat(builder, d, _V8F)), builder.fmul(mn, _splat(builder, builder.fneg(dmin), _V8F))


def _q4k_nibbles(builder, bp, j, q5):
    """64 unsigned weights (elements 64j .. 64j+63 of the superblock) from qs[32j : 32j+32]:
    low nibbles first (32-block 2j), then high nibbles (32-block 2j+1). Q5_K (q5) adds the fifth
    bit of 32-block b, bit b of qh[l] (qh[32] sits before qs)."""
    v = _bcast32(builder, bp, (48 if q5 else 16) + 32 * j)
    v = builder.and_(_lshr8(builder, v, [0] * 16 + [4] * 16), _const(_V64I8, 0x0F))
    if q5:
        h = _lshr8(builder, _bcast32(builder, bp, 16), [2 * j] * 16 + [2 * j + 1] * 16)
        h = _shl8(builder, builder.and_(h, _const(_V64I8, 0x01)), [4] * 32)
        v = builder.or_(v, h)
    return v


def _q4k_quants(builder, bp, j):
    return _q4k_nibbles(builder, bp, j, False)


def _q5k_quants(builder, bp, j):
    return _q4k_nibbles(builder, bp, j, True)


IQ4XS_BYTES = 136  # d f16 | scales_h u16 | scales_l[4] | qs[128]
# IQ4_NL/IQ4_XS non-linear levels + 128 (unsigned bytes)
_IQ4_LEVELS_U8 = [v + 128 for v in (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)]


def _lut16(builder, idx):
    """_IQ4_LEVELS_U8[idx] for a 64 x i8 vector of indices 0..15: vpshufb on AVX-512 hosts (the
    VNNI ones), a chain of 16 selects elsewhere."""
    if USE_VNNI:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V64I8, [_V64I8, _V64I8]), "llvm.x86.avx512.pshuf.b.512")
        return builder.call(fn, [_const(_V64I8, _IQ4_LEVELS_U8 * 4), idx])
    out = _const(_V64I8, _IQ4_LEVELS_U8[0])
    for i in range(1, 16):
        out = builder.select(builder.icmp_unsigned("==", idx, _const(_V64I8, i)), _const(_V64I8, _IQ4_LEVELS_U8[i]), out)
    return out


def _iq4xs_quants(builder, bp, j):
    """64 unsigned weights (codebook level + 128) of 32-blocks 2j, 2j+1: block b's 16 bytes
    qs[16b : 16b+16] give elements 0-15 (low nibbles) then 16-31 (high nibbles)."""
    v = _ld(builder, bp, 8 + 32 * j, _V32I8)
    v = _shuf(builder, v, list(range(16)) * 2 + list(range(16, 32)) * 2)
    nib = builder.and_(_lshr8(builder, v, ([0] * 8 + [4] * 8) * 2), _const(_V64I8, 0x0F))
    return _lut16(builder, nib)


def _iq4xs_scales(builder, bp):
    """(s, c) float32 [8]: s_b = d · (6-bit scale - 32), low 4 bits from nibble b of bytes 4-7,
    top 2 from bits 2b of the u16 at byte 2; c = -128 · s (the levels' +128 shift)."""
    d = _f16(builder, _ld(builder, bp, 0, _I16))
    sl = _splat(builder, _ld(builder, bp, 4, _I32), _V8I32)
    sh = _splat(builder, builder.zext(_ld(builder, bp, 2, _I16), _I32), _V8I32)
    lo = builder.and_(builder.lshr(sl, _const(_V8I32, [4 * b for b in range(8)])), _const(_V8I32, 0x0F))
    hi = builder.and_(builder.lshr(sh, _const(_V8I32, [2 * b for b in range(8)])), _const(_V8I32, 3))
    ls = builder.sub(builder.or_(lo, builder.shl(hi, _const(_V8I32, 4))), _const(_V8I32, 32))
    s8 = builder.fmul(builder.sitofp(ls, _V8F), _splat(builder, d, _V8F))
    return s8, builder.fmul(s8, _splat(builder, ir.Constant(_F32, -128.0), _V8F))


# gemv layout of the per-32 types: superblock chunk j = 2h + e (64 bytes) holds elements
# 16e .. 16e+15 of blocks 4h .. 4h+3, 16 bytes per block, so two vpdpbusd accumulate four blocks in
# disjoint lanes and one halving less sums them (activations permuted alike: interleave_blocks).
_IL_SHIFT = ([0] * 8 + [4] * 8) * 2  # per 16-bit lane: low nibbles in 128-bit lanes 0, 2; high in 1, 3


def _q4k_il(builder, bp, j, q5):
    """Chunk j = 2h + e of one Q4_K (Q5_K: q5) superblock in the gemv layout. Blocks 4h, 4h+1 are
    the low / high nibbles of qs[64h : 64h+32], blocks 4h+2, 4h+3 those of qs[64h+32 : 64h+64];
    Q5_K adds bit b of qh[l] as the fifth bit of element l of block b."""
    h, e = divmod(j, 2)
    v = _ld(builder, bp, (48 if q5 else 16) + 64 * h, _V64I8)
    v = _shuf(builder, v, [16 * lane + i for lane in (e, e, 2 + e, 2 + e) for i in range(16)])
    v = builder.and_(_lshr8(builder, v, _IL_SHIFT), _const(_V64I8, 0x0F))
    if q5:
        qh = _shuf(builder, _ld(builder, bp, 16 + 16 * e, _V16I8), list(range(16)) * 4)
        qh = _lshr8(builder, qh, [4 * h + i for i in range(4) for _ in range(8)])
        v = builder.or_(v, _shl8(builder, builder.and_(qh, _const(_V64I8, 0x01)), [4] * 32))
    return v


def _q4k_quants_il(builder, bp, j):
    return _q4k_il(builder, bp, j, False)


def _q5k_quants_il(builder, bp, j):
    return _q4k_il(builder, bp, j, True)


def _iq4xs_quants_il(builder, bp, j):
    """Chunk j = 2h + e of one IQ4_XS superblock in the gemv layout: block b is qs[16b : 16b+16],
    low nibbles elements 0-15, high nibbles 16-31."""
    h, e = divmod(j, 2)
    v = _ld(builder, bp, 8 + 64 * h, _V64I8)
    nib = builder.and_(_lshr8(builder, v, [4 * e] * 32), _const(_V64I8, 0x0F))
    return _lut16(builder, nib)


def _make_k32_decode_row(bbytes, quants, scales):
    """Row-decode intrinsic of a per-32 type (see _make_k32_row_dot) into (u, s, c)."""

    @intrinsic
    def _decode_row(typingctx, w, woff, nsb, u, uoff, s, soff, c, coff):
        if not (_is_arr(w, types.uint8) and _is_arr(u, types.uint8) and _is_arr(s, types.float32)
                and _is_arr(c, types.float32) and _ints(woff, nsb, uoff, soff, coff)):
            return None
        sig = types.void(w, woff, nsb, u, uoff, s, soff, c, coff)

        def codegen(context, builder, signature, args):
            st = signature.args
            ptr = lambda k: _base(context, builder, st[k], args[k], _i64(context, builder, args[k + 1], st[k + 1]))  # noqa: E731
            wp, up, sp, cp = ptr(0), ptr(3), ptr(5), ptr(7)
            ns = args[2]

            def body(i, _):
                bp = builder.gep(wp, [builder.mul(i, ir.Constant(_I64, bbytes))])
                ub = builder.gep(up, [builder.mul(i, ir.Constant(_I64, 256))])
                fo = builder.mul(i, ir.Constant(_I64, 32))
                ws, c8 = scales(builder, bp)
                _st(builder, ws, sp, fo)
                _st(builder, c8, cp, fo)
                for j in range(4):
                    _st(builder, quants(builder, bp, j), ub, 64 * j)
                return []

            _loop(builder, _i64(context, builder, ns, st[2]), body, [])
            return context.get_dummy_value()

        return sig, codegen

    return _decode_row


_q4k_decode_row = _make_k32_decode_row(Q4K_BYTES, _q4k_quants, _q4k_scales)
_q5k_decode_row = _make_k32_decode_row(Q5K_BYTES, _q5k_quants, _q4k_scales)
_iq4xs_decode_row = _make_k32_decode_row(IQ4XS_BYTES, _iq4xs_quants, _iq4xs_scales)


@nb.njit(cache=True, nogil=True, inline="always")
def q4k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff):
    """One Q4_K row (nsb superblocks at byte woff of w) -> unsigned weights u uint8 [256·nsb],
    per-32 scales s float32 [8·nsb] and biases c = -dmin·min float32 [8·nsb], each written from
    its element offset (uoff, soff, coff): w_e = s[e//32] · u_e + c[e//32]."""
    _q4k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff)


@nb.njit(cache=True, nogil=True, inline="always")
def q5k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff):
    """As q4k_decode_row for a Q5_K row (u holds 5-bit values)."""
    _q5k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff)


@nb.njit(cache=True, nogil=True, inline="always")
def iq4xs_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff):
    """As q4k_decode_row for an IQ4_XS row: u = codebook level + 128, c = -128·s."""
    _iq4xs_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff)


# ------------------------------------------------------------------------------- Q6_K, Q3_K, Q2_K (per-16 scales)


def _q6k_quants(builder, bp, c):
    """64 unsigned 6-bit weights (elements 64c .. 64c+63) of one Q6_K block: low 4 bits from
    ql[64h : 64h+64] (h = c // 2; low nibbles for even c, high for odd), the top 2 bits from
    qh[32h : 32h+32] (bit pairs 0-1, 2-3 for even c, 4-5, 6-7 for odd c)."""
    h, odd = divmod(c, 2)
    ql = _ld(builder, bp, 64 * h, _V64I8)
    qh = _bcast32(builder, bp, 128 + 32 * h)
    m30, m0f = _const(_V64I8, 0x30), _const(_V64I8, 0x0F)
    if odd:
        hi = builder.and_(_lshr8(builder, qh, [0] * 16 + [2] * 16), m30)
        lo = builder.and_(_lshr8(builder, ql, [4] * 32), m0f)
    else:
        hi = builder.and_(_shl8(builder, qh, [4] * 16 + [2] * 16), m30)
        lo = builder.and_(ql, m0f)
    return builder.or_(lo, hi)


def _q6k_scales(builder, bp):
    """(s, c) float32 [16] per-16 scales d · scales[i] (int8) and biases -32 · s."""
    d = _f16(builder, _ld(builder, bp, 208, _I16))
    sc = builder.sitofp(builder.sext(_ld(builder, bp, 192, _V16I8), _V16I32), _V16F)
    s16 = builder.fmul(sc, _splat(builder, d, _V16F))
    return s16, builder.fmul(s16, _splat(builder, ir.Constant(_F32, -32.0), _V16F))


def _low2(builder, bp, qs_off, c):
    """Q2_K/Q3_K 2-bit quants of elements 64c .. 64c+63: element e takes bits 2·((e%128)//32)
    of qs[32·(e//128) + e%32] (qs at byte qs_off)."""
    h, i = divmod(c, 2)
    v = _lshr8(builder, _bcast32(builder, bp, qs_off + 32 * h), [4 * i] * 16 + [4 * i + 2] * 16)
    return builder.and_(v, _const(_V64I8, 0x03))


def _q3k_quants(builder, bp, c):
    """64 unsigned 3-bit weights (elements 64c .. 64c+63) of one Q3_K block (value u - 4): 2 low
    bits from qs (at byte 32), the third from bit e//32 of hmask[e%32] (at byte 0)."""
    hb = _lshr8(builder, _bcast32(builder, bp, 0), [2 * c] * 16 + [2 * c + 1] * 16)
    hb = _shl8(builder, builder.and_(hb, _const(_V64I8, 0x01)), [2] * 32)
    return builder.or_(_low2(builder, bp, 32, c), hb)


def _q3k_scales(builder, bp):
    """(s, c) float32 [16]: d · (6-bit scale - 32) and -4 · s. Scale i: low 4 bits from byte
    96 + i%8 (low nibble for i < 8, high otherwise), top 2 bits from byte 104 + i%4, bits 2·(i//4)."""
    d = _f16(builder, _ld(builder, bp, 108, _I16))
    a = _ld(builder, bp, 96, _v(_I8, 8))
    a16 = builder.zext(_shuf(builder, a, list(range(8)) * 2), _V16I32)
    lo = builder.and_(builder.lshr(a16, _const(_V16I32, [0] * 8 + [4] * 8)), _const(_V16I32, 0x0F))
    h = builder.zext(_shuf(builder, _ld(builder, bp, 104, _v(_I8, 4)), [i % 4 for i in range(16)]), _V16I32)
    hi = builder.and_(builder.lshr(h, _const(_V16I32, [2 * (i // 4) for i in range(16)])), _const(_V16I32, 3))
    sc = builder.sub(builder.or_(lo, builder.shl(hi, _const(_V16I32, 4))), _const(_V16I32, 32))
    s16 = builder.fmul(builder.sitofp(sc, _V16F), _splat(builder, d, _V16F))
    return s16, builder.fmul(s16, _splat(builder, ir.Constant(_F32, -4.0), _V16F))


def _q2k_quants(builder, bp, c):
    """64 unsigned 2-bit weights (elements 64c .. 64c+63) of one Q2_K block (qs at byte 16)."""
    return _low2(builder, bp, 16, c)


def _q2k_scales(builder, bp):
    """(s, c) float32 [16]: d · (scales[i] & 15) and -dmin · (scales[i] >> 4)."""
    dd = _ld(builder, bp, 80, _I32)
    d = _f16(builder, builder.trunc(dd, _I16))
    dmin = _f16(builder, builder.trunc(builder.lshr(dd, ir.Constant(_I32, 16)), _I16))
    sc = builder.zext(_ld(builder, bp, 0, _V16I8), _V16I32)
    s16 = builder.fmul(builder.uitofp(builder.and_(sc, _const(_V16I32, 0x0F)), _V16F), _splat(builder, d, _V16F))
    mn = builder.uitofp(builder.lshr(sc, _const(_V16I32, 4)), _V16F)
    return s16, builder.fmul(mn, _splat(builder, builder.fneg(dmin), _V16F))


def _make_k16_decode_row(bbytes, quants, scales):
    """Row-decode intrinsic of a type with per-16 scales and biases (Q6_K, Q3_K, Q2_K) into
    (u, s, c): quants(builder, bp, c) gives the unsigned weights of 64-element chunk c of the
    block at i8* bp, scales(builder, bp) the per-16 (s, c) with w_e = s · u_e + c."""

    @intrinsic
    def _decode_row(typingctx, w, woff, nsb, u, uoff, s, soff, c, coff):
        if not (_is_arr(w, types.uint8) and _is_arr(u, types.uint8) and _is_arr(s, types.float32)
                and _is_arr(c, types.float32) and _ints(woff, nsb, uoff, soff, coff)):
            return None
        sig = types.void(w, woff, nsb, u, uoff, s, soff, c, coff)

        def codegen(context, builder, signature, args):
            st = signature.args
            ptr = lambda k: _base(context, builder, st[k], args[k], _i64(context, builder, args[k + 1], st[k + 1]))  # noqa: E731
            wp, up, sp, cp = ptr(0), ptr(3), ptr(5), ptr(7)

            def body(i, _):
                bp = builder.gep(wp, [builder.mul(i, ir.Constant(_I64, bbytes))])
                ub = builder.gep(up, [builder.mul(i, ir.Constant(_I64, 256))])
                fo = builder.mul(i, ir.Constant(_I64, 64))
                s16, c16 = scales(builder, bp)
                _st(builder, s16, sp, fo)
                _st(builder, c16, cp, fo)
                for ch in range(4):
                    _st(builder, quants(builder, bp, ch), ub, 64 * ch)
                return []

            _loop(builder, _i64(context, builder, args[2], st[2]), body, [])
            return context.get_dummy_value()

        return sig, codegen

    return _decode_row


_q6k_decode_row = _make_k16_decode_row(Q6K_BYTES, _q6k_quants, _q6k_scales)
_q3k_decode_row = _make_k16_decode_row(Q3K_BYTES, _q3k_quants, _q3k_scales)
_q2k_decode_row = _make_k16_decode_row(Q2K_BYTES, _q2k_quants, _q2k_scales)


@nb.njit(cache=True, nogil=True, inline="always")
def q6k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff):
    """One Q6_K row -> unsigned weights u uint8 [256·nsb] (q + 32), per-16 scales s float32
    [16·nsb] and biases c = -32·s, from element offsets uoff, soff, coff:
    w_e = s[e//16] · u_e + c[e//16]."""
    _q6k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff)


@nb.njit(cache=True, nogil=True, inline="always")
def q3k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff):
    """As q6k_decode_row for a Q3_K row: u = q + 4 (0..7), c = -4·s."""
    _q3k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff)


@nb.njit(cache=True, nogil=True, inline="always")
def q2k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff):
    """As q6k_decode_row for a Q2_K row: u = q (0..3), s = d·scale, c = -dmin·min."""
    _q2k_decode_row(w, woff, nsb, u, uoff, s, soff, c, coff)


# ------------------------------------------------------------------------------- gemv: 2 rows × nt tokens

# Type kinds: one compiled gemv and one compiled gemm serve every type, `kind` picks the decoder.
KIND_Q4K, KIND_Q6K, KIND_IQ4XS, KIND_Q5K, KIND_Q3K, KIND_Q2K = 0, 1, 2, 3, 4, 5
GEMV_TOKENS = 4  # most tokens per rows-dot call (the weights are unpacked once for all of them)

_EV16, _OD16 = list(range(0, 32, 2)), list(range(1, 32, 2))  # even / odd lanes of two 16-lane vectors
_EV8, _OD8 = list(range(0, 16, 2)), list(range(1, 16, 2))


def _tree8x2(builder, w):
    """_tree8 of both 8-lane halves of a 16-lane float vector at once -> 2 lanes (same adds, lane by
    lane, so each half's sum is bit-identical to _tree8's)."""
    p = builder.fadd(_shuf(builder, w, _EV8), _shuf(builder, w, _OD8))  # [8]
    q = builder.fadd(_shuf(builder, p, (0, 2, 4, 6)), _shuf(builder, p, (1, 3, 5, 7)))  # [4]
    return builder.fadd(_shuf(builder, q, (0, 2)), _shuf(builder, q, (1, 3)))  # [2]


def _make_rows_dot(family, bbytes, quants, scales, nt):
    """gemv intrinsic: two rows × nt tokens. Each superblock of the two rows is unpacked once
    (quants(builder, bp, j): unsigned weights of 64-element chunk j of the block at i8* bp, for
    "s32" in the gemv layout (_q4k_il);
    scales(builder, bp): per-32 ([8]) or per-16 ([16]) float32 (s, c) with w_e = s · u_e + c)
    and multiplied with every token's int8 activations; the float work of the two rows shares
    16-lane vectors (row 0 in lanes 0-7, row 1 in 8-15 after the per-block stage), lane by lane
    the same operations as tile_dot (batch invariance). family: "s32" per-32 scales and biases,
    "s16" per-16 scales and biases, "s16i" per-16 scales with c = -B·s, folded into the integer
    dots (xb then holds int32 B · half sums)."""
    per16 = family != "s32"
    nf = 16 if per16 else 8  # activation terms per superblock

    @intrinsic
    def _rows_dot(typingctx, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride):
        if not (_is_arr(w, types.uint8) and _is_arr(x, types.int8) and _is_arr(xa, types.float32)
                and _is_arr(xb, types.float32) and _is_arr(out, types.float32)
                and _ints(woff0, woff1, xoff, xstride, doff, dstride, nsb, o0, o1, ostride)):
            return None
        sig = types.void(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)

        def codegen(context, builder, signature, args):
            st = signature.args
            i64 = lambda k: _i64(context, builder, args[k], st[k])  # noqa: E731
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            wps = [_base(context, builder, st[0], args[0], i64(k)) for k in (1, 2)]
            tok = lambda k, off, stride, t: _base(  # noqa: E731
                context, builder, st[k], args[k], builder.add(i64(off), builder.mul(i64(stride), c64(t))))
            xps = [tok(3, 4, 5, t) for t in range(nt)]
            xaps = [tok(6, 8, 9, t) for t in range(nt)]
            xbps = [tok(7, 8, 9, t) for t in range(nt)]
            vf = _V16F if per16 else _V8F

            def body(i, acc):
                rows = []  # per row: (s, c, 4 chunks of unsigned weights), kept in registers
                for wp in wps:
                    bp = builder.gep(wp, [builder.mul(i, c64(bbytes))])
                    sc, cc = scales(builder, bp)
                    rows.append((sc, cc, [quants(builder, bp, j) for j in range(4)]))
                fo = builder.mul(i, c64(4 * nf))
                new = []
                for t in range(nt):
                    xbase = builder.gep(xps[t], [builder.mul(i, c64(256))])
                    xv = [_ld(builder, xbase, 64 * j, _V64I8) for j in range(4)]
                    xav, xbv = _ld(builder, xaps[t], fo, vf), _ld(builder, xbps[t], fo, vf)
                    g = []
                    for sc, cc, qv in rows:
                        if family == "s32":  # gemv layout: lanes 4i .. 4i+3 of chain h hold block 4h + i
                            z = ir.Constant(_V16I32, None)
                            a = [_dpbusd(builder, _dpbusd(builder, z, qv[2 * h], xv[2 * h]), qv[2 * h + 1], xv[2 * h + 1])
                                 for h in range(2)]
                            g.append(_halve(builder, a[0], a[1]))  # [16] exact sums: 2 lanes per block
                        else:
                            d = [_dpbusd(builder, ir.Constant(_V16I32, None), qv[j], xv[j]) for j in range(4)]
                            g.append(_group_sums(builder, d, 2))  # [16] exact sums of 4 lanes
                    if family == "s16i":
                        # tile_dot_s16_ib's block term, op for op: xd·(float(lo - B·X_lo)·s_lo + float(hi - B·X_hi)·s_hi)
                        xbi = builder.bitcast(xbv, _V16I32)
                        p = [builder.fmul(builder.sitofp(builder.sub(g[r], xbi), _V16F), rows[r][0]) for r in range(2)]
                        v = builder.fadd(_shuf(builder, p[0], _EV16, p[1]), _shuf(builder, p[0], _OD16, p[1]))
                        wv = builder.fmul(_shuf(builder, xav, _EV8 * 2), v)
                    elif per16:
                        # tile_dot_s16_b16's block term, op for op:
                        # (lo·(xd·s_lo) + hi·(xd·s_hi)) + (c_lo·xb_lo + c_hi·xb_hi)
                        p = [builder.fmul(builder.sitofp(g[r], _V16F), builder.fmul(xav, rows[r][0])) for r in range(2)]
                        q = [builder.fmul(rows[r][1], xbv) for r in range(2)]
                        v = builder.fadd(_shuf(builder, p[0], _EV16, p[1]), _shuf(builder, p[0], _OD16, p[1]))
                        bias = builder.fadd(_shuf(builder, q[0], _EV16, q[1]), _shuf(builder, q[0], _OD16, q[1]))
                        wv = builder.fadd(v, bias)  # [16]: row 0's 8 block terms, then row 1's
                    else:
                        # tile_dot_s32_b32's block term, op for op: S·(xd·s) + c·(xd·xs)
                        sums = builder.sitofp(_halve(builder, g[0], g[1]), _V16F)  # [16] block dots
                        two = list(range(8)) * 2
                        s16 = _shuf(builder, rows[0][0], range(16), rows[1][0])
                        c16 = _shuf(builder, rows[0][1], range(16), rows[1][1])
                        v = builder.fmul(sums, builder.fmul(_shuf(builder, xav, two), s16))
                        wv = builder.fadd(v, builder.fmul(c16, _shuf(builder, xbv, two)))
                    new.append(builder.fadd(acc[t], _tree8x2(builder, wv)))
                return new

            acc = _loop(builder, i64(10), body, [ir.Constant(_v(_F32, 2), None)] * nt)
            op = _base(context, builder, st[11], args[11], ir.Constant(_I64, 0))
            for t in range(nt):
                for r, k in enumerate((12, 13)):
                    o = builder.add(i64(k), builder.mul(i64(14), c64(t)))
                    _st(builder, builder.extract_element(acc[t], ir.Constant(_I32, r)), op, builder.mul(o, c64(4)))
            return context.get_dummy_value()

        return sig, codegen

    return _rows_dot


_TYPES_K32 = {KIND_Q4K: (Q4K_BYTES, _q4k_quants_il, _q4k_scales), KIND_Q5K: (Q5K_BYTES, _q5k_quants_il, _q4k_scales),
              KIND_IQ4XS: (IQ4XS_BYTES, _iq4xs_quants_il, _iq4xs_scales)}
_TYPES_K16 = {KIND_Q6K: (Q6K_BYTES, _q6k_quants, _q6k_scales), KIND_Q3K: (Q3K_BYTES, _q3k_quants, _q3k_scales),
              KIND_Q2K: (Q2K_BYTES, _q2k_quants, _q2k_scales)}
# _DOT[kind][nt]: rows-dot intrinsic for 1, 2 or 4 tokens
_FAMILY = {KIND_Q4K: "s32", KIND_Q5K: "s32", KIND_IQ4XS: "s32", KIND_Q6K: "s16i", KIND_Q3K: "s16i", KIND_Q2K: "s16"}
_DOT = {kind: {nt: _make_rows_dot(_FAMILY[kind], *spec, nt) for nt in (1, 2, 4)}
        for kind, spec in {**_TYPES_K32, **_TYPES_K16}.items()}
_q4k_dot1, _q4k_dot2, _q4k_dot4 = (_DOT[KIND_Q4K][t] for t in (1, 2, 4))
_q5k_dot1, _q5k_dot2, _q5k_dot4 = (_DOT[KIND_Q5K][t] for t in (1, 2, 4))
_iq4xs_dot1, _iq4xs_dot2, _iq4xs_dot4 = (_DOT[KIND_IQ4XS][t] for t in (1, 2, 4))
_q6k_dot1, _q6k_dot2, _q6k_dot4 = (_DOT[KIND_Q6K][t] for t in (1, 2, 4))
_q3k_dot1, _q3k_dot2, _q3k_dot4 = (_DOT[KIND_Q3K][t] for t in (1, 2, 4))
_q2k_dot1, _q2k_dot2, _q2k_dot4 = (_DOT[KIND_Q2K][t] for t in (1, 2, 4))


@nb.njit(cache=True, nogil=True, inline="always")
def rows_dot(kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride):
    """Dots of two rows of type `kind` (nsb superblocks at bytes woff0 / woff1 of w; may be the same
    row) with nt (1, 2 or 4) tokens' int8 activations (token t at element xoff + t·xstride of x;
    per-32 types: permuted by interleave_blocks),
    written to out's flat elements o0 + t·ostride / o1 + t·ostride. xa / xb float32 hold token t's
    activation terms from element doff + t·dstride on: per-32 types the block scales and scale ×
    block sums [k/32]; per-16 types (Q6_K, Q3_K, Q2_K) per 16-half the block scale and scale ×
    half sum [k/16]. Each superblock is unpacked once for all nt tokens."""
    if kind == KIND_Q4K:
        if nt == 4:
            _q4k_dot4(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        elif nt == 2:
            _q4k_dot2(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        else:
            _q4k_dot1(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
    elif kind == KIND_Q6K:
        if nt == 4:
            _q6k_dot4(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        elif nt == 2:
            _q6k_dot2(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        else:
            _q6k_dot1(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
    elif kind == KIND_Q5K:
        if nt == 4:
            _q5k_dot4(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        elif nt == 2:
            _q5k_dot2(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        else:
            _q5k_dot1(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
    elif kind == KIND_IQ4XS:
        if nt == 4:
            _iq4xs_dot4(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        elif nt == 2:
            _iq4xs_dot2(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        else:
            _iq4xs_dot1(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
    elif kind == KIND_Q3K:
        if nt == 4:
            _q3k_dot4(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        elif nt == 2:
            _q3k_dot2(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        else:
            _q3k_dot1(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
    else:
        if nt == 4:
            _q2k_dot4(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        elif nt == 2:
            _q2k_dot2(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)
        else:
            _q2k_dot1(w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride)


# ------------------------------------------------------------------------------- gemm tile


TILE_ROWS = 4  # weight rows per tile_dot call: each activation vector load serves all of them


def _make_tile_dot(scale16: bool, bias16: bool, ibias: bool = False, nt: int = TOKENS):
    """Intrinsic for TILE_ROWS decoded rows × one nt-token tile (16: zmm lanes, 8: ymm lanes, as
    fast per token on hosts that split 512-bit ops in two); scale16 / bias16: per-16 (else
    per-32) weight scales / biases; ibias: biases c = -B·s folded into the integer dots (xbt then
    holds int32 B · half sums; c is not read)."""

    @intrinsic
    def _tile_dot(typingctx, u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff,
                  xbt, xboff, nblk, out, ooff):
        if not (_is_arr(u, types.uint8) and _is_arr(s, types.float32) and _is_arr(c, types.float32)
                and _is_arr(xi, types.int8) and _is_arr(xdt, types.float32) and _is_arr(xbt, types.float32)
                and _is_arr(out, types.float32)
                and _ints(uoff, ustride, soff, sstride, coff, cstride, xioff, xdoff, xboff, nblk, ooff)):
            return None
        sig = types.void(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff,
                         xbt, xboff, nblk, out, ooff)

        def codegen(context, builder, signature, args):
            st = signature.args
            i64 = lambda k: _i64(context, builder, args[k], st[k])  # noqa: E731
            ptr = lambda k: _base(context, builder, st[k], args[k], i64(k + 1))  # noqa: E731
            up, sp, cp, xp, xdp, xbp, op = (ptr(k) for k in (0, 3, 6, 9, 11, 13, 16))
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            # per-row base pointers (strides in elements: bytes for u, 4-byte floats for s and c)
            ur = [builder.gep(up, [builder.mul(i64(2), c64(r))]) for r in range(TILE_ROWS)]
            sr = [builder.gep(sp, [builder.mul(i64(5), c64(4 * r))]) for r in range(TILE_ROWS)]
            cr = [builder.gep(cp, [builder.mul(i64(8), c64(4 * r))]) for r in range(TILE_ROWS)]
            nsc, nbias = (2 if scale16 else 1), (2 if bias16 else 1)
            vi, vf, vb = _v(_I32, nt), _v(_F32, nt), _v(_I8, 4 * nt)
            zero_i, zero_f = ir.Constant(vi, None), ir.Constant(vf, None)
            fsplat = lambda p, off: _splat(builder, _ld(builder, p, off, _F32), vf)  # noqa: E731

            def block_terms(b):
                """Per-row [nt]-token vectors of the canonical block term w_b (see _tree8)."""
                xb = builder.gep(xp, [builder.mul(b, c64(32 * nt))])
                ub = builder.mul(b, c64(32))
                lo, hi = [zero_i] * TILE_ROWS, [zero_i] * TILE_ROWS
                for g in range(8):  # int32 chains per row: elements 0-15 (lo), 16-31 (hi)
                    xv = _ld(builder, xb, 4 * nt * g, vb)
                    for r in range(TILE_ROWS):
                        wword = _ld(builder, ur[r], builder.add(ub, c64(4 * g)), _I32)
                        wv = builder.bitcast(_splat(builder, wword, vi), vb)
                        if g < 4:
                            lo[r] = _dpbusd(builder, lo[r], wv, xv)
                        else:
                            hi[r] = _dpbusd(builder, hi[r], wv, xv)
                xd = _ld(builder, xdp, builder.mul(b, c64(4 * nt)), vf)
                xbv = [_ld(builder, xbp, builder.add(builder.mul(b, c64(4 * nt * nbias)), c64(4 * nt * q)), vf)
                       for q in range(nbias)]
                sb = builder.mul(b, c64(4 * nsc))
                cb = builder.mul(b, c64(4 * nbias))
                out = []
                if ibias:
                    xbi = [builder.bitcast(v, vi) for v in xbv]
                    for r in range(TILE_ROWS):
                        lo_f = builder.sitofp(builder.sub(lo[r], xbi[0]), vf)
                        hi_f = builder.sitofp(builder.sub(hi[r], xbi[1]), vf)
                        v = builder.fadd(builder.fmul(lo_f, fsplat(sr[r], sb)), builder.fmul(hi_f, fsplat(sr[r], builder.add(sb, c64(4)))))
                        out.append(builder.fmul(xd, v))
                    return out
                for r in range(TILE_ROWS):
                    if scale16:
                        v = builder.fadd(builder.fmul(builder.sitofp(lo[r], vf), builder.fmul(xd, fsplat(sr[r], sb))),
                                         builder.fmul(builder.sitofp(hi[r], vf),
                                                      builder.fmul(xd, fsplat(sr[r], builder.add(sb, c64(4))))))
                    else:
                        v = builder.fmul(builder.sitofp(builder.add(lo[r], hi[r]), vf), builder.fmul(xd, fsplat(sr[r], sb)))
                    bias = builder.fmul(fsplat(cr[r], cb), xbv[0])
                    if bias16:
                        bias = builder.fadd(bias, builder.fmul(fsplat(cr[r], builder.add(cb, c64(4))), xbv[1]))
                    out.append(builder.fadd(v, bias))
                return out

            def body(i, acc):  # one superblock: 8 blocks summed in _tree8's order, then added
                b0 = builder.mul(i, c64(8))
                w = [block_terms(builder.add(b0, c64(j))) for j in range(8)]
                new = []
                for r in range(TILE_ROWS):
                    t = [w[j][r] for j in range(8)]
                    p = [builder.fadd(t[2 * j], t[2 * j + 1]) for j in range(4)]
                    tot = builder.fadd(builder.fadd(p[0], p[1]), builder.fadd(p[2], p[3]))
                    new.append(builder.fadd(acc[r], tot))
                return new

            nsb = builder.udiv(i64(15), c64(8))
            acc = _loop(builder, nsb, body, [zero_f] * TILE_ROWS)
            for r in range(TILE_ROWS):
                _st(builder, acc[r], op, 4 * nt * r)
            return context.get_dummy_value()

        return sig, codegen

    return _tile_dot


_tile_dot_s32_b32 = _make_tile_dot(False, False)
_tile_dot_s16_b16 = _make_tile_dot(True, True)
_tile_dot_s16_ib = _make_tile_dot(True, True, True)
_tile8_dot_s32_b32 = _make_tile_dot(False, False, nt=8)
_tile8_dot_s16_b16 = _make_tile_dot(True, True, nt=8)
_tile8_dot_s16_ib = _make_tile_dot(True, True, True, nt=8)

@nb.njit(cache=True, nogil=True, inline="always")
def tile_dot_s32_b32(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                     nblk, out, ooff):
    """TILE_ROWS decoded rows × one 16-token tile over nblk 32-blocks b (nblk a multiple of 8);
    for row r and token t, out[ooff + 16r + t] = Σ_b w_b with the block term
        w_b = float(Σ_j u_r[32b+j] · x_t[32b+j]) · (xdt[b, t] · s_r[b]) + c_r[b] · xbt[b, t]
    (per-32 weight scale s and bias c), summed in the canonical order (pairwise tree over each
    superblock's 8 terms, superblocks in sequence) that the gemv row dots reproduce exactly.
    Row r's u uint8 [nblk·32] starts at element uoff + r·ustride (s, c float32 [nblk] likewise);
    xi int8 is the 4-interleaved tile [nblk][8 groups][16 tokens][4] from xioff; xdt float32
    [nblk][16] activation scales from xdoff; xbt float32 [nblk][16] scale × block sums from xboff.
    Nothing is bounds-checked."""
    _tile_dot_s32_b32(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                      nblk, out, ooff)


@nb.njit(cache=True, nogil=True, inline="always")
def tile_dot_s16_b16(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                     nblk, out, ooff):
    """As tile_dot_s32_b32 with per-16 scales and biases: s_r, c_r float32 [nblk][2] and xbt float32
    [nblk][2][16] (scale × sums of elements 0-15 and 16-31 of each block), and the block term
        w_b = (float(lo) · (xdt · s_r[b,0]) + float(hi) · (xdt · s_r[b,1]))
              + (c_r[b,0] · xbt[b,0,t] + c_r[b,1] · xbt[b,1,t])."""
    _tile_dot_s16_b16(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                      nblk, out, ooff)


@nb.njit(cache=True, nogil=True, inline="always")
def tile_dot_s16_ib(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                    nblk, out, ooff):
    """As tile_dot_s16_b16 for per-16 types whose bias is c = -B·s (Q6_K B = 32, Q3_K B = 4): xbt
    holds, as int32 bits, [nblk][2][16] B × the sums of elements 0-15 and 16-31 of each block, and
    the block term is
        w_b = xdt · (float(lo - xbt[b,0,t]) · s_r[b,0] + float(hi - xbt[b,1,t]) · s_r[b,1])
    (the bias leaves the float work: exact integer dots of the signed weights); c is not read."""
    _tile_dot_s16_ib(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                     nblk, out, ooff)


@nb.njit(cache=True, nogil=True, inline="always")
def tile_dot(kind, nt, u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
             nblk, out, ooff):
    """The tile dot of type `kind` for an nt-token tile (16 or 8; the layouts above with 16
    replaced by nt): tile_dot_s32_b32 for per-32 types, tile_dot_s16_ib for Q6_K / Q3_K,
    tile_dot_s16_b16 for Q2_K."""
    if kind == KIND_Q6K or kind == KIND_Q3K:
        if nt == 8:
            _tile8_dot_s16_ib(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                              nblk, out, ooff)
        else:
            _tile_dot_s16_ib(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                             nblk, out, ooff)
    elif kind == KIND_Q2K:
        if nt == 8:
            _tile8_dot_s16_b16(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                               nblk, out, ooff)
        else:
            _tile_dot_s16_b16(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                              nblk, out, ooff)
    else:
        if nt == 8:
            _tile8_dot_s32_b32(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                               nblk, out, ooff)
        else:
            _tile_dot_s32_b32(u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
                              nblk, out, ooff)


@nb.njit(cache=True, nogil=True)
def interleave_blocks(xq):
    """int8 [n, k] activations -> [n, k] in the per-32 types' gemv layout: per superblock, chunk
    j = 2h + e holds elements 16e .. 16e+15 of 32-blocks 4h .. 4h+3 (16-byte pieces moved)."""
    n, k = xq.shape
    out = empty_aligned(n, k, np.int8)  # [n, k]
    src = xq.view(np.int64)  # [n, k/8]: a 16-byte piece is two int64
    dst = out.view(np.int64)
    for t in range(n):
        for sb in range(k // 256):
            base = sb * 32
            for h in range(2):
                for e in range(2):
                    for i in range(4):
                        o = base + 2 * (8 * h + 4 * e + i)
                        p = base + 2 * (8 * h + 2 * i + e)
                        dst[t, o] = src[t, p]
                        dst[t, o + 1] = src[t, p + 1]
    return out
