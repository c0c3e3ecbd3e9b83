"""IQ1_S, IQ1_M, TQ1_0, TQ2_0 and MXFP4 superblocks unpacked in registers, and their type table.

The same interface as kquant_unpack: per 256-element superblock at i8* bp, `quants(builder, bp, j)`
the 64 unsigned weight bytes of chunk j (0..3) and `scales(builder, bp)` float32 (s, c) per 32
([8]) or per 16 ([16]) with w_e = s · u_e + c. The per-32 types also have the gemv layout (_il:
chunk j = 2h + e holds elements 16e .. 16e+15 of blocks 4h .. 4h+3, as kquant_gemv's). Signed
weights become unsigned by an offset folded into c:
  IQ1_S / IQ1_M  u = 8·(grid + 1) + 1 ± 1 in 0..18: w = (d·(2·scale+1) / 8) · (u - 9) = dl·(grid ± 1/8)
  TQ1_0 / TQ2_0  u = trit 0..2: w = d · (u - 1)
  MXFP4          u = 2·E2M1 value + 12 in 0..24: w = e8m0_half(e) · (u - 12)
An MXFP4 "superblock" is 8 of its 17-byte blocks (136 bytes); a row's last partial one is read
from a zero-padded copy (see lowbit_rows).
"""

from functools import partial

import numpy as np
from llvmlite import ir
from numba.core import cgutils

from edged.backends.cpu.kquant_unpack import _lshr8, _low2
from edged.backends.cpu.vector_ir import (
    I1, I16, I32, I64, V8F, V8I32, V16F, V16I8, V16I32, V32I8, V64I8, const, f16_to_f32, iq4_lookup, load,
    shuf, splat, vec,
)
from edged.quant.iq_grids import (
    IQ1_M_BYTES, IQ1_S_BYTES, IQ1S_GRID, MXFP4_BYTES, MXFP4_VALUES, TQ1_0_BYTES, TQ2_0_BYTES,
)

KIND_IQ1S, KIND_IQ1M, KIND_TQ1, KIND_TQ2, KIND_MXFP4 = 0, 1, 2, 3, 4

V8I64 = vec(I64, 8)
MXFP4_SB_BYTES = 8 * MXFP4_BYTES  # 8 blocks of 32: one 256-element unit of the kernels

# element order of chunk j: natural (elements 64j .. 64j+63) or the gemv layout (_il)
_NATURAL = [[64 * j + p for p in range(64)] for j in range(4)]
_IL = [[32 * (4 * (j // 2) + i) + 16 * (j % 2) + l for i in range(4) for l in range(16)] for j in range(4)]


# ------------------------------------------------------------------------------- IQ1_S, IQ1_M


# grid row -> 8 bytes 8·(grid + 1) + 1 in {1, 9, 17}, as one little-endian uint64 per row
_IQ1_U64 = ((IQ1S_GRID.astype(np.int64) + 1) * 8 + 1).astype(np.uint8).view(np.uint64).reshape(-1)  # [2048]


def _iq1_gather(builder, idx, minus):
    """64 bytes u of 8 groups: grid rows idx (<8 x i64>) as {1, 9, 17}, then +1 per group, or -1
    where minus (<8 x i1>: delta -1/8), giving 8·(grid + 1) + 1 ± 1."""
    rows_u8 = ir.Constant(ir.ArrayType(I64, 2048), [int(v) for v in _IQ1_U64])
    table = cgutils.global_constant(builder, "edged_iq1_grid_u8", rows_u8)
    base = splat(builder, builder.ptrtoint(table, I64), V8I64)
    ptrs = builder.inttoptr(builder.add(base, builder.shl(idx, const(V8I64, 3))), vec(I64.as_pointer(), 8))
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(V8I64, [ptrs.type, I32, vec(I1, 8), V8I64]), "llvm.masked.gather.v8i64.v8p0")
    rows = builder.call(fn, [ptrs, ir.Constant(I32, 8), const(vec(I1, 8), 1), ir.Constant(V8I64, None)])
    step = builder.select(minus, const(V8I64, -1), const(V8I64, 0x0101010101010101))
    return builder.add(builder.bitcast(rows, V64I8), builder.bitcast(step, V64I8))


def _iq1s_quants(builder, bp, j, order):
    """Chunk j of one IQ1_S superblock (d f16 | qs[32] | qh u16[8]): group g (8 elements) is grid
    row qs[g] | ((qh[g/4] >> 3·(g%4)) & 7) << 8, delta sign bit 15 of qh[g/4]."""
    groups = [order[j][8 * q] // 8 for q in range(8)]
    qs = load(builder, bp, 2, V32I8)
    qh = builder.zext(shuf(builder, load(builder, bp, 34, vec(I16, 8)), [g // 4 for g in groups]), V8I64)
    hi = builder.and_(builder.lshr(qh, const(V8I64, [3 * (g % 4) for g in groups])), const(V8I64, 7))
    idx = builder.or_(builder.zext(shuf(builder, qs, groups), V8I64), builder.shl(hi, const(V8I64, 8)))
    minus = builder.icmp_unsigned("!=", builder.and_(qh, const(V8I64, 0x8000)), const(V8I64, 0))
    return _iq1_gather(builder, idx, minus)


def _iq1s_scales(builder, bp):
    """(s, c) float32 [8]: s = d·(2·((qh[b] >> 12) & 7) + 1) / 8, c = -9·s."""
    d = f16_to_f32(builder, load(builder, bp, 0, I16))
    qh = builder.zext(load(builder, bp, 34, vec(I16, 8)), V8I32)
    sc = builder.and_(builder.lshr(qh, const(V8I32, 12)), const(V8I32, 7))
    odd = builder.or_(builder.shl(sc, const(V8I32, 1)), const(V8I32, 1))
    s = builder.fmul(builder.fmul(builder.sitofp(odd, V8F), splat(builder, d, V8F)), const(V8F, [0.125] * 8))
    return s, builder.fmul(s, const(V8F, [-9.0] * 8))


def _iq1m_quants(builder, bp, j):
    """Chunk j (natural order) of one IQ1_M superblock (qs[32] | qh[16] | scales u16[4]): group g
    is grid row qs[g] | (nibble & 7) << 8 with nibble (qh[g/2] >> 4·(g%2)), delta sign its bit 3."""
    groups = list(range(8 * j, 8 * j + 8))
    qs = load(builder, bp, 0, V32I8)
    qh = builder.zext(shuf(builder, load(builder, bp, 32, V16I8), [g // 2 for g in groups]), V8I64)
    nib = builder.lshr(qh, const(V8I64, [4 * (g % 2) for g in groups]))
    hi = builder.and_(nib, const(V8I64, 7))
    idx = builder.or_(builder.zext(shuf(builder, qs, groups), V8I64), builder.shl(hi, const(V8I64, 8)))
    minus = builder.icmp_unsigned("!=", builder.and_(nib, const(V8I64, 8)), const(V8I64, 0))
    return _iq1_gather(builder, idx, minus)


def _iq1m_scales(builder, bp):
    """(s, c) float32 [16] per 16: s = d·(2·scale + 1) / 8, scale i = bits 3·(i%4) of the u16
    scales[i/4]; d the fp16 made of the four u16s' top nibbles (scales[0] lowest); c = -9·s."""
    sc = [builder.zext(load(builder, bp, 48 + 2 * i, I16), I32) for i in range(4)]
    top = [builder.and_(builder.lshr(sc[i], ir.Constant(I32, 12 - 4 * i)), ir.Constant(I32, 0xF << (4 * i)))
           for i in range(4)]
    d = f16_to_f32(builder, builder.trunc(builder.or_(builder.or_(top[0], top[1]), builder.or_(top[2], top[3])), I16))
    s16 = builder.zext(shuf(builder, load(builder, bp, 48, vec(I16, 4)), [i // 4 for i in range(16)]), V16I32)
    lv = builder.and_(builder.lshr(s16, const(V16I32, [3 * (i % 4) for i in range(16)])), const(V16I32, 7))
    odd = builder.or_(builder.shl(lv, const(V16I32, 1)), const(V16I32, 1))
    s = builder.fmul(builder.fmul(builder.sitofp(odd, V16F), splat(builder, d, V16F)), const(V16F, [0.125] * 16))
    return s, builder.fmul(s, const(V16F, [-9.0] * 16))


# ------------------------------------------------------------------------------- TQ1_0, TQ2_0


def _tq_scales(builder, bp, doff):
    """(s, c) float32 [8]: d (fp16 at doff) and -d."""
    d = splat(builder, f16_to_f32(builder, load(builder, bp, doff, I16)), V8F)
    return d, builder.fneg(d)


def _tq1_source(e):
    """(byte, power of 3) of element e of a TQ1_0 superblock: 5 trits in each of qs[0:32]
    (elements 32p + l) and qs[32:48] (160 + 16p + l), 4 in each of qh = bytes 48-51 (240 + 4p + l)."""
    if e < 160:
        return e % 32, e // 32
    if e < 240:
        return 32 + (e - 160) % 16, (e - 160) // 16
    return 48 + (e - 240) % 4, (e - 240) // 4


def _tq1_quants(builder, bp, j, order):
    """Chunk j of one TQ1_0 superblock (qs[48] | qh[4] | d f16): trit p of byte b is
    ((b · 3^p mod 256) · 3) >> 8."""
    src = [_tq1_source(e) for e in order[j]]
    lo = load(builder, bp, 0, V32I8)
    mid = load(builder, bp, 32, V16I8)
    tail = shuf(builder, load(builder, bp, 48, vec(ir.IntType(8), 4)), list(range(4)) * 4)
    all52 = shuf(builder, lo, range(64), shuf(builder, mid, range(32), tail))  # bytes 0..51 (then junk)
    v = builder.mul(shuf(builder, all52, [b for b, _ in src]), const(V64I8, [3**p % 256 for _, p in src]))
    w = builder.lshr(builder.mul(builder.zext(v, vec(I16, 64)), const(vec(I16, 64), 3)), const(vec(I16, 64), 8))
    return builder.trunc(w, V64I8)


def _tq2_quants_il(builder, bp, j):
    """Chunk j = 2h + e of one TQ2_0 superblock (qs[64] | d f16) in the gemv layout: block 4h + i
    is bits 2i of qs[32h + 16e : +16] (element e' takes bits 2·((e'%128)/32) of qs[32·(e'/128) + e'%32])."""
    h, e = divmod(j, 2)
    v = shuf(builder, load(builder, bp, 32 * h + 16 * e, V16I8), list(range(16)) * 4)
    return builder.and_(_lshr8(builder, v, [2 * i for i in range(4) for _ in range(8)]), const(V64I8, 3))


# ------------------------------------------------------------------------------- MXFP4


_MXFP4_U8 = tuple(int(v) + 12 for v in MXFP4_VALUES)  # E2M1 values doubled (-12..12) + 12


def _mxfp4_pieces(builder, bp, blocks):
    """The 16 qs bytes of each of 4 blocks (at 17·b + 1), side by side in one 64-byte vector."""
    p = [load(builder, bp, MXFP4_BYTES * b + 1, V16I8) for b in blocks]
    return shuf(builder, shuf(builder, p[0], range(32), p[1]), range(64), shuf(builder, p[2], range(32), p[3]))


def _mxfp4_quants_il(builder, bp, j):
    """Chunk j = 2h + e in the gemv layout: nibble e (elements 16e .. 16e+15) of blocks 4h .. 4h+3."""
    h, e = divmod(j, 2)
    v = _mxfp4_pieces(builder, bp, [4 * h + i for i in range(4)])
    return iq4_lookup(builder, builder.and_(_lshr8(builder, v, [4 * e] * 32), const(V64I8, 0x0F)), _MXFP4_U8)


def _mxfp4_quants(builder, bp, j):
    """Chunk j (natural order): blocks 2j, 2j+1, each low nibbles (elements 0-15) then high."""
    v = _mxfp4_pieces(builder, bp, [2 * j, 2 * j, 2 * j + 1, 2 * j + 1])
    return iq4_lookup(builder, builder.and_(_lshr8(builder, v, ([0] * 8 + [4] * 8) * 2), const(V64I8, 0x0F)), _MXFP4_U8)


def _mxfp4_scales(builder, bp):
    """(s, c) float32 [8]: s = e8m0_half(e) of each block's first byte, bits e < 2 ? 0x200000 << e
    : (e - 1) << 23 (a power of two: half the E8M0 scale, as the doubled values want), c = -12·s."""
    e = ir.Constant(V8I32, None)
    for b in range(8):
        eb = builder.zext(load(builder, bp, MXFP4_BYTES * b, ir.IntType(8)), I32)
        e = builder.insert_element(e, eb, ir.Constant(I32, b))
    small = builder.icmp_unsigned("<", e, const(V8I32, 2))
    bits = builder.select(small, builder.shl(const(V8I32, 0x00200000), e),
                          builder.shl(builder.sub(e, const(V8I32, 1)), const(V8I32, 23)))
    s = builder.bitcast(bits, V8F)
    return s, builder.fmul(s, const(V8F, [-12.0] * 8))


# kind -> (superblock bytes, gemv-layout quants, quants, scales, family, sub-blocks?): families as
# kquant_unpack's ("s32": per-32 scales and biases; "s16i": per-16 scales, c = -B·s with B = 9 folded
# into the integer dots); sub-blocks: a row may end inside a superblock (MXFP4: 32-element blocks).
TYPES = {
    KIND_IQ1S: (IQ1_S_BYTES, partial(_iq1s_quants, order=_IL), partial(_iq1s_quants, order=_NATURAL), _iq1s_scales,
                "s32", False),
    KIND_IQ1M: (IQ1_M_BYTES, _iq1m_quants, _iq1m_quants, _iq1m_scales, "s16i", False),
    KIND_TQ1: (TQ1_0_BYTES, partial(_tq1_quants, order=_IL), partial(_tq1_quants, order=_NATURAL),
               partial(_tq_scales, doff=52), "s32", False),
    KIND_TQ2: (TQ2_0_BYTES, _tq2_quants_il, lambda b, p, j: _low2(b, p, 0, j), partial(_tq_scales, doff=64), "s32",
               False),
    KIND_MXFP4: (MXFP4_SB_BYTES, _mxfp4_quants_il, _mxfp4_quants, _mxfp4_scales, "s32", True),
}
IQ1M_BIAS = 9  # B of IQ1_M's s16i family (u - 9)
