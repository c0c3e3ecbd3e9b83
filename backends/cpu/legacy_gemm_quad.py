"""The legacy types' gemm on decoded rows: four weight rows × one 16-token tile (quad_tile_dot),
each row first decoded once (decode_row) into unsigned words and per-block float (d, c); or,
for one tile of grouped Q8_0 rows, read in place (FORM_DIRECT_Q8_0: only their scales decoded).

legacy_gemm_tile decodes blocks inside the tile and keeps a row's 8 lane accumulators live (the
canonical order of legacy_blocks); four rows there would need 32 vector accumulators and spill.
Here the tile visits the blocks lane by lane (j = b mod 8 outer, b increasing inner), which adds
each lane's terms in the same order, so one accumulator per row is live, and each activation
vector load serves four rows. Bits: the same block terms and tree as legacy_gemm_tile and the gemv.

Decoded row (decode_row), for ceil(k/256) groups of 8 blocks:
    u  uint8   word g (the unsigned bytes of elements 4g..4g+3) of block 8·grp + j at byte
               256·grp + 32·g + 4·j (the grouped layout's transposed words)
    d, c float32 [8·groups] the block's scale and bias (legacy_blocks.block_scale_bias)
A grouped Q8_0 group (legacy_groups) holds those words already, 4·nb bytes apart after its nb
fp16 scales: a one-tile gemm (a 16-sequence decode step's output projection) then reads them in
place, where decoding cost as much as a third of its time.
"""

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.legacy_blocks import (ALL_KINDS, GROUPED_KINDS, INT_BIAS, LAYOUTS, block_scale_bias, block_u8,
                                              kind_layout, tree8_vectors)
from edged.backends.cpu.legacy_gemm_tile import TOKENS, _tile_block_int, _tile_start, _tile_term
from edged.backends.cpu.legacy_groups import GROUP, TAIL, field_offsets, group_scales, group_words, whole_groups
from edged.backends.cpu.vector_ir import F32, I8, I32, I64

ROWS = 4  # weight rows per quad_tile_dot call
GROUP_BYTES = 256  # decoded bytes of a group of 8 blocks
KIND_Q8_0 = 0  # legacy_blocks.LAYOUTS' Q8_0
# quad_tile_dot's forms: the bias a float term (Q4_1, Q5_1), in the integer dot (the symmetric
# types), or that on grouped Q8_0 rows read in place (no decode: their words are u already)
FORM_FLOAT_BIAS, FORM_INT_BIAS, FORM_DIRECT_Q8_0 = 0, 1, 2
FORMS = (FORM_FLOAT_BIAS, FORM_INT_BIAS, FORM_DIRECT_Q8_0)


def _emit_decode(context, builder, rowty, row, up, dp, cp, layout, grouped):
    """decode_row's body for one layout: the row (a uint8 array) into i8* up, dp and cp (the
    words, d and c); without up and cp, d alone (decode_scales)."""
    size = layout[0]
    c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    rp = vir.base_ptr(context, builder, rowty, row, c64(0))
    nbytes = builder.extract_value(context.make_array(rowty)(context, builder, row).shape, 0)
    nblk = builder.udiv(vir.as_i64(context, builder, nbytes, types.intp), c64(size))

    def raw_block(b):
        blk = builder.gep(rp, [builder.mul(b, c64(size))])
        if up is not None:
            words = builder.bitcast(block_u8(builder, blk, layout), ir.VectorType(I32, 8))
            base = builder.add(builder.mul(builder.udiv(b, c64(GROUP)), c64(GROUP_BYTES)),
                               builder.mul(builder.urem(b, c64(GROUP)), c64(4)))
            for g in range(8):
                word = builder.extract_element(words, ir.Constant(I32, g))
                vir.store(builder, word, up, builder.add(base, c64(32 * g)))
        bd, bc = block_scale_bias(builder, blk, layout)
        vir.store(builder, bd, dp, builder.mul(b, c64(4)))
        if cp is not None:
            vir.store(builder, bc, cp, builder.mul(b, c64(4)))

    def group(grp, nb):
        gp = builder.gep(rp, [builder.mul(grp, c64(GROUP * size))])
        if up is not None:
            ubase = builder.mul(grp, c64(GROUP_BYTES))
            for g, w in enumerate(group_words(builder, gp, layout, nb)):
                vir.store(builder, w, up, builder.add(ubase, c64(32 * g)))
        gd, gc = group_scales(builder, gp, layout, nb)
        fbase = builder.mul(grp, c64(4 * GROUP))
        vir.store(builder, gd, dp, fbase)
        if cp is not None:
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
        at = signature.args
        up, dp, cp = (vir.base_ptr(context, builder, at[k], args[k], vir.as_i64(context, builder, args[off], at[off]))
                      for k, off in ((2, 3), (4, 6), (5, 6)))

        def body(k):
            layout, grouped = kind_layout(k)
            _emit_decode(context, builder, at[0], args[0], up, dp, cp, layout, grouped)

        vir.emit_switch(builder, args[1], {k: (lambda k=k: body(k)) for k in ALL_KINDS})
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _decode_scales(typingctx, row, d, soff):
    if not (vir.is_arr(row, types.uint8) and row.ndim == 1 and vir.is_arr(d, types.float32) and vir.ints(soff)):
        return None

    def codegen(context, builder, signature, args):
        at = signature.args
        dp = vir.base_ptr(context, builder, at[1], args[1], vir.as_i64(context, builder, args[2], at[2]))
        _emit_decode(context, builder, at[0], args[0], None, dp, None, LAYOUTS[KIND_Q8_0], True)
        return context.get_dummy_value()

    return types.void(row, d, soff), codegen


@nb.njit(cache=True, nogil=True, inline="always")
def decode_row(row, kind, u, uoff, d, c, soff):
    """Decode one weight row (uint8, kind_layout(kind)'s blocks, raw or grouped; kind run-time)
    into u from byte uoff and d, c from element soff (the module docstring's layout: u needs
    256 bytes and d, c 8 floats per started group of 8 blocks). quad_tile_dot prefetches the rows
    it decodes."""
    _decode_row(row, kind, u, uoff, d, c, soff)


@nb.njit(cache=True, nogil=True, inline="always")
def decode_scales(row, d, soff):
    """A grouped Q8_0 row's block scales into d from element soff, as decode_row's d: what
    quad_tile_dot's FORM_DIRECT_Q8_0 reads beside the row itself."""
    _decode_scales(row, d, soff)


def _emit_quad(context, builder, signature, args, form):
    """quad_tile_dot's body for one of FORMS: args (u, ustride, d, c, sstride, xi, xdt, xst, out,
    nblk, w, row, pf, form)."""
    at, b = signature.args, builder
    c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    i64 = lambda k: vir.as_i64(context, b, args[k], at[k])  # noqa: E731
    ustride, sstride, nblk, row, pf = i64(1), i64(4), i64(9), i64(11), i64(12)
    bias = form != FORM_FLOAT_BIAS
    warr = context.make_array(at[10])(context, b, args[10])
    rowbytes = vir.as_i64(context, b, b.extract_value(warr.strides, 0), types.intp)
    wp = b.bitcast(warr.data, I8.as_pointer())
    if form == FORM_DIRECT_Q8_0:  # the grouped rows themselves: their words are the decoded layout's
        urs = [b.gep(wp, [b.mul(b.add(row, c64(r)), rowbytes)]) for r in range(ROWS)]
    else:
        up = vir.base_ptr(context, b, at[0], args[0], c64(0))
        urs = [b.gep(up, [b.mul(ustride, c64(r))]) for r in range(ROWS)]
    dps, cps = ([b.bitcast(vir.base_ptr(context, b, at[k], args[k], b.mul(sstride, c64(r))), F32.as_pointer())
                 for r in range(ROWS)] for k in (2, 3))
    xp = vir.base_ptr(context, b, at[5], args[5], c64(0))
    xdp, xsp = vir.f32_ptr(context, b, at[6], args[6]), vir.f32_ptr(context, b, at[7], args[7])
    # the raw rows' bytes pf past this quad's first (the rows decoded next), a part per lane: the
    # reads then stream while the quad computes, where one burst at the decode stalled it
    ahead = b.gep(wp, [b.add(b.mul(row, rowbytes), pf)])
    part = b.udiv(b.add(b.mul(rowbytes, c64(ROWS)), c64(64 * GROUP - 1)), c64(64 * GROUP))  # lines per lane
    v16f = ir.VectorType(F32, TOKENS)
    q8 = LAYOUTS[KIND_Q8_0][0]  # a Q8_0 block's bytes

    def block(blk, accs, woff, stride, scale):
        """accs plus block blk's terms, its words at byte woff (+ stride per word) of each row;
        scale(r) its (d, c)."""
        xb = b.gep(xp, [b.mul(blk, c64(512))])
        sums = _tile_block_int(b, [b.gep(ur, [woff]) for ur in urs], xb, stride=stride,
                               start=_tile_start(b, xsp, blk, bias))
        return [b.fadd(acc, _tile_term(b, s, *scale(r), xdp, xsp, blk, bias))
                for r, (acc, s) in enumerate(zip(accs, sums))]

    def scale(blk):
        return lambda r: (b.load(b.gep(dps[r], [blk])), b.load(b.gep(cps[r], [blk])))

    lanes = [[None] * GROUP for _ in range(ROWS)]
    nfull = b.udiv(nblk, c64(GROUP))
    tail = b.udiv(b.urem(nblk, c64(GROUP)), c64(TAIL))  # direct: 1 where a group of 4 ends the row
    for j in range(GROUP):
        with b.if_then(b.icmp_signed(">", pf, c64(0))):
            with cgutils.for_range(b, part) as lp:
                vir.prefetch_lines(b, ahead, b.mul(b.add(b.mul(part, c64(j)), lp.index), c64(64)), 64)
        if form == FORM_DIRECT_Q8_0:
            def body(gi, accs, j=j, nb=GROUP):
                """block 8·gi + j, in a group of nb blocks (its words 4·nb bytes apart)"""
                blk = b.add(b.mul(gi, c64(GROUP)), c64(j))
                qpos = field_offsets(LAYOUTS[KIND_Q8_0], nb)[2]
                woff = b.add(b.mul(gi, c64(GROUP * q8)), c64(qpos + 4 * j))
                return block(blk, accs, woff, 4 * nb, scale(blk))

            tots = vir.loop(b, nfull, body, [ir.Constant(v16f, None)] * ROWS)
            if j < TAIL:
                tots = vir.loop(b, tail, lambda _, accs, j=j: body(nfull, accs, j, TAIL), tots)
        else:
            count = b.udiv(b.add(nblk, c64(GROUP - 1 - j)), c64(GROUP))  # blocks blk ≡ j (mod 8), blk < nblk

            def body(gi, accs, j=j):
                blk = b.add(b.mul(gi, c64(GROUP)), c64(j))
                return block(blk, accs, b.add(b.mul(gi, c64(GROUP_BYTES)), c64(4 * j)), 32, scale(blk))

            tots = vir.loop(b, count, body, [ir.Constant(v16f, None)] * ROWS)
        for r, tot in enumerate(tots):
            lanes[r][j] = tot
    op = vir.base_ptr(context, b, at[8], args[8], c64(0))
    for r in range(ROWS):
        vir.store(b, tree8_vectors(b, lanes[r]), op, 4 * TOKENS * r)


@intrinsic
def _quad_tile_dot(typingctx, u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, form):
    f32a = lambda a: vir.is_arr(a, types.float32) and a.ndim == 1  # noqa: E731
    if not (vir.is_arr(u, types.uint8) and u.ndim == 1 and f32a(d) and f32a(c) and vir.is_arr(xi, types.int8)
            and xi.ndim == 1 and f32a(xdt) and f32a(xst) and f32a(out)
            and vir.ints(ustride, sstride, nblk, row, pf, form)
            and vir.is_arr(w, types.uint8) and w.ndim == 2):
        return None
    sig = types.void(u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, form)

    def codegen(context, builder, signature, args):
        key = vir.as_i64(context, builder, args[13], signature.args[13])
        vir.emit_switch(builder, key,
                        {f: (lambda f=f: _emit_quad(context, builder, signature, args, f)) for f in FORMS})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def quad_tile_dot(u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, form):
    """out float32 [64]: row r's 16 tokens at 16·r, for the 4 decoded rows (row r's words in u
    from byte r·ustride, its d and c from element r·sstride) · the tile (legacy_gemm_tile's xi,
    xdt, xst) over nblk blocks. The same bits as legacy_gemm_tile.row_tile_dot_raw8 of each row.
    form: FORM_FLOAT_BIAS; FORM_INT_BIAS for a symmetric type (legacy_blocks.int_bias), whose
    tile xst holds -B·xs as int32 bits and whose c is not read; FORM_DIRECT_Q8_0 as FORM_INT_BIAS,
    but the words are read in place from grouped Q8_0 rows row..row+3 of w (uint8 [m, row
    bytes]; direct_q8_0 says which rows qualify), d from decode_scales. pf > 0 prefetches four
    rows' bytes of w from pf past the start of its row `row` (the quad's first), spread over
    the computation."""
    _quad_tile_dot(u, ustride, d, c, sstride, xi, xdt, xst, out, nblk, w, row, pf, form)


@nb.njit(cache=True, nogil=True, inline="always")
def direct_q8_0(kind, nblk):
    """Whether quad_tile_dot can read rows of this kind in place (FORM_DIRECT_Q8_0): grouped Q8_0
    rows whose blocks are all in groups of 8 or a last group of 4."""
    return kind == GROUPED_KINDS + KIND_Q8_0 and whole_groups(nblk)


@nb.njit(cache=True, nogil=True, inline="always")
def quad_form(kind, nblk, ntile):
    """quad_tile_dot's form for rows of a block kind over ntile tiles: in place for one tile of
    rows direct_q8_0 takes (with several tiles the decode is paid once and the unaligned in-place
    reads once a tile: ~1.04x slower, docs/kernels.md), else the bias in the integer dot for the
    symmetric types (the tiles' xst holds its start) or a float term."""
    if ntile == 1 and direct_q8_0(kind, nblk):
        return FORM_DIRECT_Q8_0
    return FORM_INT_BIAS if INT_BIAS[kind % GROUPED_KINDS] > 0 else FORM_FLOAT_BIAS
