"""The legacy types' gemm on decoded rows: four weight rows × one 16-token tile (quad_tile_dot),
each row first decoded once (decode_row) into unsigned words and per-block float (d, c).

legacy_gemm_tile decodes blocks inside the tile and keeps a row's 8 lane accumulators live (the
canonical order of legacy_blocks); four rows there would need 32 vector accumulators and spill.
Here the tile visits the blocks lane by lane (j = b mod 8 outer, b increasing inner), which adds
each lane's terms in the same order, so one accumulator per row is live, and each activation
vector load serves four rows. Bits: the same block terms and tree as legacy_gemm_tile and the gemv.

Decoded row (decode_row), for ceil(k/256) groups of 8 blocks:
    u  uint8   word g (the unsigned bytes of elements 4g..4g+3) of block 8·grp + j at byte
               256·grp + 32·g + 4·j (the grouped layout's transposed words)
    d, c float32 [8·groups] the block's scale and bias (legacy_blocks.block_scale_bias)
"""

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.legacy_blocks import ALL_KINDS, block_scale_bias, block_u8, kind_layout, tree8_vectors
from edged.backends.cpu.legacy_gemm_tile import TOKENS, _tile_block_int, _tile_start, _tile_term
from edged.backends.cpu.legacy_groups import GROUP, TAIL, group_scales, group_words
from edged.backends.cpu.vector_ir import F32, I8, I32, I64

ROWS = 4  # weight rows per quad_tile_dot call
GROUP_BYTES = 256  # decoded bytes of a group of 8 blocks


def _emit_decode(context, builder, signature, args, layout, grouped):
    """decode_row's body for one layout: args (row, kind, u, uoff, d, c, soff)."""
    at = signature.args
    row, _, u, uoff, d, c, soff = args
    size = layout[0]
    c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    i64 = lambda k: vir.as_i64(context, builder, args[k], at[k])  # noqa: E731
    rp = vir.base_ptr(context, builder, at[0], row, c64(0))
    nbytes = builder.extract_value(context.make_array(at[0])(context, builder, row).shape, 0)
    nblk = builder.udiv(vir.as_i64(context, builder, nbytes, types.intp), c64(size))
    up = vir.base_ptr(context, builder, at[2], u, i64(3))
    dp = vir.base_ptr(context, builder, at[4], d, i64(6))
    cp = vir.base_ptr(context, builder, at[5], c, i64(6))

    def raw_block(b):
        blk = builder.gep(rp, [builder.mul(b, c64(size))])
        words = builder.bitcast(block_u8(builder, blk, layout), ir.VectorType(I32, 8))
        base = builder.add(builder.mul(builder.udiv(b, c64(GROUP)), c64(GROUP_BYTES)),
                           builder.mul(builder.urem(b, c64(GROUP)), c64(4)))
        for g in range(8):
            vir.store(builder, builder.extract_element(words, ir.Constant(I32, g)), up, builder.add(base, c64(32 * g)))
        bd, bc = block_scale_bias(builder, blk, layout)
        vir.store(builder, bd, dp, builder.mul(b, c64(4)))
        vir.store(builder, bc, cp, builder.mul(b, c64(4)))

    def group(grp, nb):
        gp = builder.gep(rp, [builder.mul(grp, c64(GROUP * size))])
        ubase = builder.mul(grp, c64(GROUP_BYTES))
        for g, w in enumerate(group_words(builder, gp, layout, nb)):
            vir.store(builder, w, up, builder.add(ubase, c64(32 * g)))
        gd, gc = group_scales(builder, gp, layout, nb)
        fbase = builder.mul(grp, c64(4 * GROUP))
        vir.store(builder, gd, dp, fbase)
        vir.store(builder, gc, cp, fbase)

    nfull = builder.udiv(nblk, c64(GROUP)) if grouped else c64(0)
    if grouped:
        with cgutils.for_range(builder, nfull) as lp:
            group(lp.index, GROUP)
    start = builder.mul(nfull, c64(GROUP))
    rem = builder.sub(nblk, start)

    def raw_rest():
        with cgutils.for_range(builder, rem) as lp:
            raw_block(builder.add(start, lp.index))

    if grouped:
        with builder.if_else(builder.icmp_unsigned("==", rem, c64(TAIL))) as (four, other):
            with four:
                group(nfull, TAIL)
            with other:
                raw_rest()
    else:
        raw_rest()


@intrinsic
def _decode_row(typingctx, row, kind, u, uoff, d, c, soff):
    if not (vir.is_arr(row, types.uint8) and row.ndim == 1 and vir.is_arr(u, types.uint8)
            and vir.is_arr(d, types.float32) and vir.is_arr(c, types.float32) and vir.ints(kind, uoff, soff)):
        return None
    sig = types.void(row, kind, u, uoff, d, c, soff)

    def codegen(context, builder, signature, args):
        def body(k):
            layout, grouped = kind_layout(k)
            _emit_decode(context, builder, signature, args, layout, grouped)

        vir.emit_switch(builder, args[1], {k: (lambda k=k: body(k)) for k in ALL_KINDS})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def decode_row(row, kind, u, uoff, d, c, soff):
    """Decode one weight row (uint8, kind_layout(kind)'s blocks, raw or grouped; kind run-time)
    into u from byte uoff and d, c from element soff (the module docstring's layout: u needs
    256 bytes and d, c 8 floats per started group of 8 blocks). quad_tile_dot prefetches the rows
    it decodes."""
    _decode_row(row, kind, u, uoff, d, c, soff)


def _emit_quad(context, builder, signature, args, bias):
    """quad_tile_dot's body for a symmetric type's rows (bias 1: the tile's dots start from xst's
    -B·xs, no c term) or not (0): args (u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w,
    row, pf, sym)."""
    at, b = signature.args, builder
    c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    i64 = lambda k: vir.as_i64(context, b, args[k], at[k])  # noqa: E731
    up = vir.base_ptr(context, b, at[0], args[0], c64(0))
    ustride, sstride, nblk, row, pf = i64(1), i64(4), i64(9), i64(11), i64(12)
    urs = [b.gep(up, [b.mul(ustride, c64(r))]) for r in range(ROWS)]
    dps, cps = ([b.bitcast(vir.base_ptr(context, b, at[k], args[k], b.mul(sstride, c64(r))), F32.as_pointer())
                 for r in range(ROWS)] for k in (2, 3))
    xp = vir.base_ptr(context, b, at[5], args[5], c64(0))
    xdp, xsp = vir.f32_ptr(context, b, at[6], args[6]), vir.f32_ptr(context, b, at[7], args[7])
    # the raw rows' bytes pf past this quad's first (the rows decoded next), a part per lane: the
    # reads then stream while the quad computes, where one burst at the decode stalled it
    warr = context.make_array(at[10])(context, b, args[10])
    rowbytes = vir.as_i64(context, b, b.extract_value(warr.strides, 0), types.intp)
    ahead = b.gep(b.bitcast(warr.data, I8.as_pointer()), [b.add(b.mul(row, rowbytes), pf)])
    part = b.udiv(b.add(b.mul(rowbytes, c64(ROWS)), c64(64 * GROUP - 1)), c64(64 * GROUP))  # lines per lane
    v16f = ir.VectorType(F32, TOKENS)
    lanes = [[None] * GROUP for _ in range(ROWS)]
    for j in range(GROUP):
        with b.if_then(b.icmp_signed(">", pf, c64(0))):
            with cgutils.for_range(b, part) as lp:
                vir.prefetch_lines(b, ahead, b.mul(b.add(b.mul(part, c64(j)), lp.index), c64(64)), 64)
        count = b.udiv(b.add(nblk, c64(GROUP - 1 - j)), c64(GROUP))  # blocks blk ≡ j (mod 8), blk < nblk

        def body(gi, accs, j=j):
            blk = b.add(b.mul(gi, c64(GROUP)), c64(j))
            xb = b.gep(xp, [b.mul(blk, c64(512))])
            woff = b.add(b.mul(gi, c64(GROUP_BYTES)), c64(4 * j))
            sums = _tile_block_int(b, [b.gep(ur, [woff]) for ur in urs], xb, stride=32, start=_tile_start(b, xsp, blk, bias))
            return [b.fadd(acc, _tile_term(b, s, b.load(b.gep(dp, [blk])), b.load(b.gep(cp, [blk])), xdp, xsp, blk, bias))
                    for acc, s, dp, cp in zip(accs, sums, dps, cps)]

        for r, tot in enumerate(vir.loop(b, count, body, [ir.Constant(v16f, None)] * ROWS)):
            lanes[r][j] = tot
    op = vir.base_ptr(context, b, at[8], args[8], c64(0))
    for r in range(ROWS):
        vir.store(b, tree8_vectors(b, lanes[r]), op, 4 * TOKENS * r)


@intrinsic
def _quad_tile_dot(typingctx, u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, sym):
    f32a = lambda a: vir.is_arr(a, types.float32) and a.ndim == 1  # noqa: E731
    if not (vir.is_arr(u, types.uint8) and u.ndim == 1 and f32a(d) and f32a(c) and vir.is_arr(xi, types.int8)
            and xi.ndim == 1 and f32a(xdt) and f32a(xst) and f32a(out) and vir.ints(ustride, sstride, nblk, row, pf, sym)
            and vir.is_arr(w, types.uint8) and w.ndim == 2):
        return None
    sig = types.void(u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, sym)

    def codegen(context, builder, signature, args):
        symmetric = builder.icmp_signed("!=", vir.as_i64(context, builder, args[13], signature.args[13]),
                                        ir.Constant(I64, 0))
        with builder.if_else(symmetric) as (yes, no):
            with yes:
                _emit_quad(context, builder, signature, args, 1)
            with no:
                _emit_quad(context, builder, signature, args, 0)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def quad_tile_dot(u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, sym):
    """out float32 [64]: row r's 16 tokens at 16·r, for the 4 decoded rows (row r's words in u
    from byte r·ustride, its d and c from element r·sstride) · the tile (legacy_gemm_tile's xi,
    xdt, xst) over nblk blocks. The same bits as legacy_gemm_tile.row_tile_dot_raw8 of each row.
    sym != 0: the rows are of a symmetric type (legacy_blocks.int_bias), whose tile xst holds
    -B·xs as int32 bits and whose c is not read. pf > 0 prefetches four rows' bytes of w (uint8
    [m, row bytes], the raw rows) from pf past the start of its row `row` (the quad's first),
    spread over the computation."""
    _quad_tile_dot(u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, sym)
