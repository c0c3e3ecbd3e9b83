"""The 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) decoded in registers, and the
canonical 8-lane float order that both legacy kernels (legacy_gemv.py, legacy_gemm_tile.py) add
their per-block terms in, so a token's output is bit-identical whichever kernel its batch picks.

Each block becomes 32 unsigned bytes u and floats (d, c) with Σ_j w_j x_j = xd · (d · Σ u·xq + c · xs).
For the symmetric types (c = -B·d, B an integer: int_bias) the kernels fold the bias into the
integer dot instead: Σ_j w_j x_j = xd · (d · (Σ u·xq - B·xs)), one float term fewer a block.
"""

from llvmlite import ir

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.vector_ir import I8, I32, IQ4_LEVELS_U8

# raw block layouts: (block bytes, quants offset, qh offset or -1, min offset or -1, nibbles?,
# bias offset for the symmetric types, 16-entry unsigned codebook or None), by kind
LAYOUTS = {
    0: (34, 2, -1, -1, False, -128.0, None),  # Q8_0: int8 q, read as q ^ 0x80
    1: (18, 2, -1, -1, True, -8.0, None),  # Q4_0
    2: (20, 4, -1, 2, True, 0.0, None),  # Q4_1: + min
    3: (22, 6, 2, -1, True, -16.0, None),  # Q5_0
    4: (24, 8, 4, 2, True, 0.0, None),  # Q5_1: + min
    5: (18, 2, -1, -1, True, -128.0, IQ4_LEVELS_U8),  # IQ4_NL: nibbles index the IQ4 levels (+128)
}

# kinds >= GROUPED_KINDS are the same types in legacy_groups' grouped layout (kind - GROUPED_KINDS)
GROUPED_KINDS = 8
ALL_KINDS = (*LAYOUTS, *(GROUPED_KINDS + k for k in LAYOUTS))


def int_bias(layout) -> int:
    """B of a symmetric type (w = d·(u - B)), folded into the integer block dot; 0 for the types
    with an fp16 min (Q4_1, Q5_1), whose bias stays a float term."""
    _, _, _, moff, _, cfix, _ = layout
    return 0 if moff >= 0 else int(-cfix)


# int_bias by raw kind (a kind's grouped twin: kind - GROUPED_KINDS), for compiled code
INT_BIAS = tuple(int_bias(LAYOUTS[k]) for k in range(len(LAYOUTS)))


def kind_layout(kind):
    """(LAYOUTS entry, grouped?) of a block kind of ALL_KINDS."""
    return (LAYOUTS[kind - GROUPED_KINDS], True) if kind >= GROUPED_KINDS else (LAYOUTS[kind], False)


def bits_mask(builder, ptr, nbits):
    """<nbits x i1>: bit i of the little-endian word of nbits bits at i8* ptr."""
    if vir.USE_VNNI:  # straight into a mask register (kmovd)
        w = builder.load(builder.bitcast(ptr, ir.IntType(nbits).as_pointer()), align=1)
        return builder.bitcast(w, ir.VectorType(ir.IntType(1), nbits))
    vb = ir.VectorType(I8, nbits // 8)
    w = builder.load(builder.bitcast(ptr, vb.as_pointer()), align=1)
    spread = builder.shuffle_vector(w, ir.Constant(vb, ir.Undefined), ir.Constant(ir.VectorType(I32, nbits), [i // 8 for i in range(nbits)]))
    vt = ir.VectorType(I8, nbits)
    hit = builder.and_(spread, ir.Constant(vt, [1 << (i % 8) for i in range(nbits)]))
    return builder.icmp_unsigned("!=", hit, ir.Constant(vt, None))


def block_u8(builder, blk, layout):
    """<32 x i8> unsigned weight bytes of one raw block at i8* blk."""
    size, qoff, hoff, moff, nib, _, book = layout
    v32i8 = ir.VectorType(I8, 32)
    if not nib:
        q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(I32, qoff)]), v32i8.as_pointer()), align=1)
        return builder.xor(q, ir.Constant(v32i8, [0x80] * 32))
    v16i8 = ir.VectorType(I8, 16)
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(I32, qoff)]), v16i8.as_pointer()), align=1)
    lo = builder.and_(q, ir.Constant(v16i8, [15] * 16))
    hi = builder.lshr(q, ir.Constant(v16i8, [4] * 16))
    u = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))
    if hoff >= 0:
        hit = bits_mask(builder, builder.gep(blk, [ir.Constant(I32, hoff)]), 32)  # bit j adds 16 to element j
        u = builder.or_(u, builder.select(hit, ir.Constant(v32i8, [16] * 32), ir.Constant(v32i8, [0] * 32)))
    if book is not None:
        u = vir.iq4_lookup(builder, u)
    return u


def f16_at(builder, blk, off):
    p = builder.bitcast(builder.gep(blk, [ir.Constant(I32, off)]), ir.HalfType().as_pointer())
    return builder.fpext(builder.load(p, align=1), ir.FloatType())


def block_scale_bias(builder, blk, layout):
    """(d, c) floats of one raw block: c = fp16 min, or d · (fixed offset) for symmetric types."""
    _, _, _, moff, _, cfix, _ = layout
    d = f16_at(builder, blk, 0)
    c = f16_at(builder, blk, moff) if moff >= 0 else builder.fmul(d, ir.Constant(ir.FloatType(), cfix))
    return d, c


# ---------------------------------------------------------------- canonical 8-lane float order
#
# Batch invariance needs gemv and gemm to add a row's per-block float terms in one fixed order:
#   lane j (0..7) = 0.0 + T_j + T_{j+8} + T_{j+16} + ... (blocks b ≡ j mod 8, increasing b),
#   result        = ((L0 + L4) + (L2 + L6)) + ((L1 + L5) + (L3 + L7)),
# with T_b = xd_b · (d_b · float(s_b - B·xs_b)) for a symmetric type (int_bias B, the integers
# exact) and T_b = xd_b · (d_b · float(s_b) + c_b · float(xs_b)) for Q4_1 / Q5_1. gemv holds
# 8 blocks in the 8 lanes of one vector (no horizontal sum per block), gemm holds 8 independent
# accumulators per token lane.


def tree8_vectors(builder, lanes):
    """The canonical final tree over the 8 lane accumulators (vectors: one lane per token)."""
    a = [builder.fadd(lanes[i], lanes[i + 4]) for i in range(4)]
    return builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3]))


def tree8_lanes(builder, v):
    """The same tree over the 8 lanes of one <8 x float> vector -> float."""
    undef = ir.Constant(v.type, ir.Undefined)
    idx = lambda ix: ir.Constant(ir.VectorType(I32, len(ix)), ix)  # noqa: E731
    a = builder.fadd(builder.shuffle_vector(v, undef, idx([0, 1, 2, 3])), builder.shuffle_vector(v, undef, idx([4, 5, 6, 7])))
    u4 = ir.Constant(a.type, ir.Undefined)
    b = builder.fadd(builder.shuffle_vector(a, u4, idx([0, 1])), builder.shuffle_vector(a, u4, idx([2, 3])))
    return builder.fadd(builder.extract_element(b, ir.Constant(I32, 0)), builder.extract_element(b, ir.Constant(I32, 1)))
