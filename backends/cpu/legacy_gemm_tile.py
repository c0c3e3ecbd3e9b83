"""The legacy types' gemm tile: one raw weight row · a 16-token tile (row_tile_dot_raw8).

The tile's int8 activations are "4-interleaved" ([block][8 groups][16 tokens][4 bytes]), so each
block is 8 vpdpbusd of a broadcast 4-byte weight word against 16 token lanes: no horizontal sum
per token. Block terms are added in legacy_blocks' canonical 8-lane order, bit-identical to the
gemv (legacy_gemv.rows_dot8) for the same token.
"""

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.legacy_blocks import LAYOUTS, block_scale_bias, block_u8, tree8_vectors
from edged.backends.cpu.vector_ir import I8, I32, V16I32

TOKENS = 16  # tokens per gemm tile: one 512-bit vector of int32 lanes
GROUPS = 8  # 4-byte groups in a 32-element block


def _tile_block_int(builder, words_ptr, xb):
    """<16 x i32> block sums of 16 tokens: 8 weight words at i8* words_ptr (broadcast from memory)
    against a 4-interleaved 512-byte tile block at i8* xb."""
    # four independent accumulator chains: one chain of 8 dependent vpdpbusd is latency-bound
    accs = [ir.Constant(V16I32, None)] * 4
    for g in range(GROUPS):
        wword = builder.load(builder.bitcast(builder.gep(words_ptr, [ir.Constant(I32, 4 * g)]), I32.as_pointer()), align=1)
        wvec = builder.insert_element(ir.Constant(V16I32, ir.Undefined), wword, ir.Constant(I32, 0))
        wvec = builder.shuffle_vector(wvec, ir.Constant(V16I32, ir.Undefined), ir.Constant(V16I32, [0] * 16))
        xvec = builder.load(builder.bitcast(builder.gep(xb, [ir.Constant(I32, 64 * g)]), V16I32.as_pointer()), align=1)
        accs[g % 4] = vir.dpbusd(builder, accs[g % 4], wvec, xvec)
    return builder.add(builder.add(accs[0], accs[1]), builder.add(accs[2], accs[3]))


def _tile_term(builder, s, d, c, xdp, xsp, b):
    """<16 x float> xdt[16b:16b+16] · (d · float(s) + c · xst[16b:16b+16])."""
    v16f = ir.VectorType(ir.FloatType(), 16)
    sf = builder.sitofp(s, v16f)
    off16 = builder.mul(b, ir.Constant(b.type, TOKENS))
    xdv = builder.load(builder.bitcast(builder.gep(xdp, [off16]), v16f.as_pointer()), align=4)
    xsv = builder.load(builder.bitcast(builder.gep(xsp, [off16]), v16f.as_pointer()), align=4)
    return builder.fmul(xdv, builder.fadd(builder.fmul(vir.splat(builder, d, v16f), sf), builder.fmul(vir.splat(builder, c, v16f), xsv)))


def _tile_sum8(builder, nblk, term):
    """Σ_b term(b) (<16 x float> per block) in the canonical 8-lane order, for b < nblk."""
    v16f = ir.VectorType(ir.FloatType(), 16)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(v16f, None)) for _ in range(8)]
    eight = ir.Constant(nblk.type, 8)
    ngroup = builder.udiv(nblk, eight)
    with cgutils.for_range(builder, ngroup) as loop:
        base = builder.mul(loop.index, eight)
        for j in range(8):  # unrolled: 8 independent add chains
            t = term(builder.add(base, ir.Constant(base.type, j)))
            builder.store(builder.fadd(builder.load(accs[j]), t), accs[j])
    base = builder.mul(ngroup, eight)
    rem = builder.sub(nblk, base)
    for j in range(7):
        with builder.if_then(builder.icmp_unsigned(">", rem, ir.Constant(rem.type, j))):
            t = term(builder.add(base, ir.Constant(base.type, j)))
            builder.store(builder.fadd(builder.load(accs[j]), t), accs[j])
    return tree8_vectors(builder, [builder.load(a) for a in accs])


def _emit_row_tile(context, builder, signature, args, layout):
    ra, _, xa, xda, xsa, oa = args
    at = signature.args
    v8i32 = ir.VectorType(I32, 8)
    size = layout[0]
    nblk = builder.extract_value(context.make_array(at[3])(context, builder, xda).shape, 0)
    nblk = builder.udiv(nblk, ir.Constant(nblk.type, TOKENS))
    rp = vir.base_ptr(context, builder, at[0], ra, ir.Constant(ir.IntType(64), 0))
    xp = vir.base_ptr(context, builder, at[2], xa, ir.Constant(ir.IntType(64), 0))
    xdp, xsp = vir.f32_ptr(context, builder, at[3], xda), vir.f32_ptr(context, builder, at[4], xsa)
    wbuf = cgutils.alloca_once(builder, v8i32)  # decoded block: weights broadcast from memory

    def term(b):
        blk = builder.gep(rp, [builder.mul(b, ir.Constant(b.type, size))])
        builder.store(builder.bitcast(block_u8(builder, blk, layout), v8i32), wbuf)
        xb = builder.gep(xp, [builder.mul(b, ir.Constant(b.type, 512))])
        s = _tile_block_int(builder, builder.bitcast(wbuf, I8.as_pointer()), xb)
        d, c = block_scale_bias(builder, blk, layout)
        return _tile_term(builder, s, d, c, xdp, xsp, b)

    tot = _tile_sum8(builder, nblk, term)
    builder.store(tot, builder.bitcast(vir.f32_ptr(context, builder, at[5], oa), tot.type.as_pointer()), align=4)


@intrinsic
def _row_tile_dot_raw8(typingctx, row, kind, xi, xdt, xst, out):
    """out[t] = row · token t of the tile (see row_tile_dot_raw8)."""
    f32a = lambda a: isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1  # noqa: E731
    ok = (
        isinstance(row, types.Array) and row.dtype == types.uint8 and row.ndim == 1
        and isinstance(kind, types.Integer)
        and (not isinstance(kind, types.IntegerLiteral) or kind.literal_value in LAYOUTS)
        and isinstance(xi, types.Array) and xi.dtype == types.int8 and xi.ndim == 1
        and f32a(xdt) and f32a(xst) and f32a(out)
    )
    if not ok:
        return None
    sig = types.void(row, kind, xi, xdt, xst, out)

    def codegen(context, builder, signature, args):
        if isinstance(kind, types.IntegerLiteral):
            _emit_row_tile(context, builder, signature, args, LAYOUTS[kind.literal_value])
        else:  # a run-time kind: one compiled body per layout behind a switch
            vir.emit_switch(builder, args[1], {
                k: (lambda lay=lay: _emit_row_tile(context, builder, signature, args, lay)) for k, lay in LAYOUTS.items()})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def row_tile_dot_raw8(row, kind, xi, xdt, xst, out):
    """out float32 [16]: one raw weight row (uint8, LAYOUTS[kind] blocks; kind a compile-time
    constant, or a run-time one that switches between the six compiled bodies) · the 16 tokens of
    a tile: xi int8 [k/32 · 512] 4-interleaved activations, xdt float32 [k/32 · 16] their block
    scales, xst float32 [k/32 · 16] their block sums."""
    _row_tile_dot_raw8(row, kind, xi, xdt, xst, out)
