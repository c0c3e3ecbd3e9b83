"""The legacy types' gemm tile: one raw weight row · a 16-token tile (row_tile_dot_raw8), or two
rows sharing each block's activation loads (rows2_tile_dot_raw8, the same bits per row).

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
from edged.backends.cpu.legacy_blocks import ALL_KINDS, block_scale_bias, block_u8, int_bias, kind_layout, tree8_vectors
from edged.backends.cpu.legacy_groups import GROUP, TAIL, block_scale_bias_at, group_words
from edged.backends.cpu.vector_ir import I8, I32, V16I32

TOKENS = 16  # tokens per gemm tile: one 512-bit vector of int32 lanes
GROUPS = 8  # 4-byte groups in a 32-element block


def _tile_block_int(builder, words_ptrs, xb, stride=4, start=None):
    """[<16 x i32>] per row: block sums of 16 tokens, 8 weight words at each i8* of words_ptrs,
    `stride` bytes apart (broadcast from memory), against a 4-interleaved 512-byte tile block at
    i8* xb (each activation vector loaded once for all rows), each plus `start` where given."""
    # independent accumulator chains: one chain of 8 dependent vpdpbusd is latency-bound
    chains = 4 // len(words_ptrs)
    zero = ir.Constant(V16I32, None)
    accs = [[zero if start is None else start] + [zero] * (chains - 1) for _ in words_ptrs]
    for g in range(GROUPS):
        xvec = builder.load(builder.bitcast(builder.gep(xb, [ir.Constant(I32, 64 * g)]), V16I32.as_pointer()), align=1)
        for r, wp in enumerate(words_ptrs):
            wword = builder.load(builder.bitcast(builder.gep(wp, [ir.Constant(I32, stride * g)]), I32.as_pointer()), align=1)
            wvec = builder.insert_element(ir.Constant(V16I32, ir.Undefined), wword, ir.Constant(I32, 0))
            wvec = builder.shuffle_vector(wvec, ir.Constant(V16I32, ir.Undefined), ir.Constant(V16I32, [0] * 16))
            accs[r][g % chains] = vir.dpbusd(builder, accs[r][g % chains], wvec, xvec)
    out = []
    for a in accs:
        while len(a) > 1:
            a = [builder.add(a[i], a[i + len(a) // 2]) for i in range(len(a) // 2)]
        out.append(a[0])
    return out


def _tile_start(builder, xsp, b, bias):
    """Tile block b's integer dot start for a symmetric type (bias > 0): <16 x i32> -B·xs, whose
    bits _prepare_tiles stored in xst[16b:16b+16]; None (start at zero) otherwise."""
    if not bias:
        return None
    off16 = builder.mul(b, ir.Constant(b.type, TOKENS))
    return builder.load(builder.bitcast(builder.gep(xsp, [off16]), V16I32.as_pointer()), align=4)


def _tile_term(builder, s, d, c, xdp, xsp, b, bias):
    """<16 x float> canonical terms of tile block b's int32 dots s: xdt[16b:16b+16] · (d · float(s))
    for a symmetric type (s started from -B·xs: _tile_start), else xdt · (d · float(s) + c · xst)."""
    v16f = ir.VectorType(ir.FloatType(), 16)
    sf = builder.sitofp(s, v16f)
    off16 = builder.mul(b, ir.Constant(b.type, TOKENS))
    xdv = builder.load(builder.bitcast(builder.gep(xdp, [off16]), v16f.as_pointer()), align=4)
    if bias:
        return builder.fmul(xdv, builder.fmul(vir.splat(builder, d, v16f), sf))
    xsv = builder.load(builder.bitcast(builder.gep(xsp, [off16]), v16f.as_pointer()), align=4)
    return builder.fmul(xdv, builder.fadd(builder.fmul(vir.splat(builder, d, v16f), sf), builder.fmul(vir.splat(builder, c, v16f), xsv)))


def _tile_sum8(builder, nblk, term, nrows, group=None):
    """Per row, Σ_b term(b)[row] (<16 x float> per block and row) in the canonical 8-lane order,
    for b < nblk. With group (grouped layouts), group(base, nb) decodes the nb blocks from base
    at once and returns their terms' function of j; a last group of neither 8 nor 4 is raw."""
    v16f = ir.VectorType(ir.FloatType(), 16)
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(v16f, None)) for _ in range(8)] for _ in range(nrows)]

    def add(terms, j):
        for acc, t in zip(accs, terms):
            builder.store(builder.fadd(builder.load(acc[j]), t), acc[j])

    eight = ir.Constant(nblk.type, 8)
    ngroup = builder.udiv(nblk, eight)
    with cgutils.for_range(builder, ngroup) as loop:
        base = builder.mul(loop.index, eight)
        terms_of = group(base, GROUP) if group else None
        for j in range(8):  # unrolled: 8 independent add chains
            add(terms_of(j) if group else term(builder.add(base, ir.Constant(base.type, j))), j)
    base = builder.mul(ngroup, eight)
    rem = builder.sub(nblk, base)

    def raw_rest():
        for j in range(7):
            with builder.if_then(builder.icmp_unsigned(">", rem, ir.Constant(rem.type, j))):
                add(term(builder.add(base, ir.Constant(base.type, j))), j)

    if group:
        with builder.if_else(builder.icmp_unsigned("==", rem, ir.Constant(rem.type, TAIL))) as (four, other):
            with four:
                terms_of = group(base, TAIL)
                for j in range(TAIL):
                    add(terms_of(j), j)
            with other:
                raw_rest()
    else:
        raw_rest()
    return [tree8_vectors(builder, [builder.load(a) for a in acc]) for acc in accs]


def _emit_row_tile(context, builder, signature, args, layout, nrows, pf=False, grouped=False):
    """out[16·r + t] = row r · token t for the nrows rows in args[:nrows] (then kind, xi,
    xdt, xst, out[, pf]), raw or grouped (legacy_groups.py); each block's activations are loaded
    once for all the rows. With pf, each block (group) step prefetches every row's bytes pf
    ahead when pf > 0."""
    ra, (xa, xda, xsa, oa) = args[:nrows], args[nrows + 1:nrows + 5]
    at = signature.args
    xat, xdat, xsat, oat = at[nrows + 1:nrows + 5]
    i64 = ir.IntType(64)
    pfv = vir.as_i64(context, builder, args[-1], at[-1]) if pf else None
    v8i32 = ir.VectorType(I32, 8)
    size, bias = layout[0], int_bias(layout)
    nblk = builder.extract_value(context.make_array(xdat)(context, builder, xda).shape, 0)
    nblk = builder.udiv(nblk, ir.Constant(nblk.type, TOKENS))
    rps = [vir.base_ptr(context, builder, at[r], ra[r], ir.Constant(ir.IntType(64), 0)) for r in range(nrows)]
    xp = vir.base_ptr(context, builder, xat, xa, ir.Constant(ir.IntType(64), 0))
    xdp, xsp = vir.f32_ptr(context, builder, xdat, xda), vir.f32_ptr(context, builder, xsat, xsa)
    wbufs = [cgutils.alloca_once(builder, v8i32) for _ in range(nrows)]  # decoded blocks: weights broadcast from memory

    def byte_off(b):
        return builder.mul(builder.zext(b, i64) if b.type.width < 64 else b, ir.Constant(i64, size))

    def prefetch(boff, nbytes):
        if pf:
            with builder.if_then(builder.icmp_signed(">", pfv, ir.Constant(i64, 0))):
                for rp in rps:
                    vir.prefetch_lines(builder, rp, builder.add(boff, pfv), nbytes)

    def term(b):
        boff = byte_off(b)
        blks = [builder.gep(rp, [boff]) for rp in rps]
        prefetch(boff, size)
        for blk, wbuf in zip(blks, wbufs):
            builder.store(builder.bitcast(block_u8(builder, blk, layout), v8i32), wbuf)
        xb = builder.gep(xp, [builder.mul(b, ir.Constant(b.type, 512))])
        sums = _tile_block_int(builder, [builder.bitcast(wb, I8.as_pointer()) for wb in wbufs], xb,
                               start=_tile_start(builder, xsp, b, bias))
        return [_tile_term(builder, s, *block_scale_bias(builder, blk, layout), xdp, xsp, b, bias)
                for s, blk in zip(sums, blks)]

    # grouped: a group's 8 transposed word vectors per row ([g][j] words), decoded once
    gbufs = [cgutils.alloca_once(builder, ir.ArrayType(v8i32, GROUP)) for _ in range(nrows)] if grouped else None

    def group(base, nb):
        boff = byte_off(base)
        gps = [builder.gep(rp, [boff]) for rp in rps]
        prefetch(boff, nb * size)
        for gp, gbuf in zip(gps, gbufs):
            for g, w in enumerate(group_words(builder, gp, layout, nb)):
                builder.store(w, builder.bitcast(builder.gep(gbuf, [ir.Constant(I32, 0), ir.Constant(I32, g)]), w.type.as_pointer()))
        wps = [builder.bitcast(gbuf, I8.as_pointer()) for gbuf in gbufs]

        def terms_of(j):
            bj = builder.add(base, ir.Constant(base.type, j))
            xb = builder.gep(xp, [builder.mul(bj, ir.Constant(bj.type, 512))])
            sums = _tile_block_int(builder, [builder.gep(wp, [ir.Constant(I32, 4 * j)]) for wp in wps], xb, stride=32,
                                   start=_tile_start(builder, xsp, bj, bias))
            return [_tile_term(builder, s, *block_scale_bias_at(builder, gp, layout, nb, j), xdp, xsp, bj, bias)
                    for s, gp in zip(sums, gps)]

        return terms_of

    op = vir.f32_ptr(context, builder, oat, oa)
    for r, tot in enumerate(_tile_sum8(builder, nblk, term, nrows, group if grouped else None)):
        dst = builder.gep(op, [ir.Constant(I32, TOKENS * r)])
        builder.store(tot, builder.bitcast(dst, tot.type.as_pointer()), align=4)


def _tile_codegen(kind, nrows, pf=False):
    """The codegen of a row-tile intrinsic over nrows rows: one body for a compile-time kind, or
    one per layout behind a run-time switch."""
    def codegen(context, builder, signature, args):
        def body(k):
            layout, grouped = kind_layout(k)
            _emit_row_tile(context, builder, signature, args, layout, nrows, pf, grouped)

        if isinstance(kind, types.IntegerLiteral):
            body(kind.literal_value)
        else:
            vir.emit_switch(builder, args[nrows], {k: (lambda k=k: body(k)) for k in ALL_KINDS})
        return context.get_dummy_value()
    return codegen


def _tile_args_ok(rows, kind, xi, xdt, xst, out):
    f32a = lambda a: isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1  # noqa: E731
    return (
        all(isinstance(r, types.Array) and r.dtype == types.uint8 and r.ndim == 1 for r in rows)
        and isinstance(kind, types.Integer)
        and (not isinstance(kind, types.IntegerLiteral) or kind.literal_value in ALL_KINDS)
        and isinstance(xi, types.Array) and xi.dtype == types.int8 and xi.ndim == 1
        and f32a(xdt) and f32a(xst) and f32a(out)
    )


@intrinsic
def _row_tile_dot_raw8(typingctx, row, kind, xi, xdt, xst, out):
    """out[t] = row · token t of the tile (see row_tile_dot_raw8)."""
    if not _tile_args_ok((row,), kind, xi, xdt, xst, out):
        return None
    return types.void(row, kind, xi, xdt, xst, out), _tile_codegen(kind, 1)


@intrinsic
def _rows2_tile_dot_raw8(typingctx, row0, row1, kind, xi, xdt, xst, out, pf):
    """out[16·r + t] = row r · token t of the tile (see rows2_tile_dot_raw8)."""
    if not (_tile_args_ok((row0, row1), kind, xi, xdt, xst, out) and isinstance(pf, types.Integer)):
        return None
    return types.void(row0, row1, kind, xi, xdt, xst, out, pf), _tile_codegen(kind, 2, pf=True)


@nb.njit(cache=True, nogil=True, inline="always")
def row_tile_dot_raw8(row, kind, xi, xdt, xst, out):
    """out float32 [16]: one weight row (uint8, kind_layout(kind)'s blocks, raw or grouped; kind a
    compile-time constant, or a run-time one that switches between the compiled bodies) · the 16 tokens of
    a tile: xi int8 [k/32 · 512] 4-interleaved activations, xdt float32 [k/32 · 16] their block
    scales, xst float32 [k/32 · 16] their block sums."""
    _row_tile_dot_raw8(row, kind, xi, xdt, xst, out)


@nb.njit(cache=True, nogil=True, inline="always")
def rows2_tile_dot_raw8(row0, row1, kind, xi, xdt, xst, out, pf):
    """row_tile_dot_raw8 of two rows at once (out float32 [32]: row0's 16 tokens, then row1's),
    each tile block's activations loaded once for both; the same bits as two single-row calls.
    pf > 0: each block step prefetches both rows' bytes pf ahead (a knob for weights read from DRAM)."""
    _rows2_tile_dot_raw8(row0, row1, kind, xi, xdt, xst, out, pf)
