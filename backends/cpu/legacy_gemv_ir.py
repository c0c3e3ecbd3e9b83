"""IR of the legacy gemv row dot (legacy_gemv.rows_dot8), one named step per method.

GemvRowEmitter.emit: for every group of 8 blocks of the row, decode and transpose the blocks
(group_weights), read their fp16 scales (group_scales), then add the 8 block terms of every token
into its 8 lane accumulators (one_token, two_tokens or, for a last group of <= 4 blocks,
packed_pairs); finally each token's 8 lanes are summed by the canonical tree into y[t, r].
"""

from types import SimpleNamespace

from llvmlite import ir
from numba.core import cgutils, types

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.legacy_blocks import block_u8, int_bias, tree8_lanes
from edged.backends.cpu.legacy_groups import GROUP, TAIL, group_scales, group_words
from edged.backends.cpu.vector_ir import I8, I32

_F32, _I64, _I1 = ir.FloatType(), ir.IntType(64), ir.IntType(1)
_V8F, _V8I32, _V8I1 = ir.VectorType(_F32, 8), ir.VectorType(I32, 8), ir.VectorType(_I1, 8)
_V8H, _V32W = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.IntType(16), 32)
_ZERO8F, _ZERO8I = ir.Constant(_V8F, None), ir.Constant(_V8I32, None)


def transpose8x8(builder, rows):
    """8 <8 x i32> rows R_j -> 8 columns W_g with W_g[j] = R_j[g] (three unpack/permute stages)."""
    def sh(a, b, ix):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, 8), ix))

    lo32, hi32 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo64, hi64 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    lo128, hi128 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    a = []
    for p in range(4):
        a += [sh(rows[2 * p], rows[2 * p + 1], lo32), sh(rows[2 * p], rows[2 * p + 1], hi32)]
    # a[2p] = R_{2p},R_{2p+1} groups {0,1 | 4,5}; a[2p+1] groups {2,3 | 6,7}
    bq = []
    for h in (0, 4):
        bq += [sh(a[h], a[h + 2], lo64), sh(a[h], a[h + 2], hi64), sh(a[h + 1], a[h + 3], lo64), sh(a[h + 1], a[h + 3], hi64)]
    # bq[q] (q<4): R_0..3 group q | group q+4; bq[4+q]: R_4..7 likewise
    w = [None] * 8
    for q in range(4):
        w[q] = sh(bq[q], bq[4 + q], lo128)
        w[q + 4] = sh(bq[q], bq[4 + q], hi128)
    return w


def _i64(v):
    return ir.Constant(_I64, v)


def _pair_of(builder, a, b):
    """Two <w x ...> -> <2w x ...>."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, 2 * a.type.count), list(range(2 * a.type.count))))


def _masked_load(builder, vty, name):
    i1v = ir.VectorType(_I1, vty.count)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty.as_pointer(), I32, i1v, vty]), name)


class GemvRowEmitter:
    """Emits rows_dot8's body for one raw block layout into (context, builder)."""

    def __init__(self, context, builder, signature, args, layout, grouped=False):
        self.b = builder
        self.layout = layout
        self.grouped = grouped  # whole groups (and a last one of 4) in legacy_groups' layout
        self.size, _, _, self.moff, _, self.cfix, _ = layout
        self.bias = int_bias(layout)  # > 0: subtracted in the integer dot (the canonical term)
        ra, _, xta, xa, xda, xsa, acca, ya, ri = args[:9]
        at = signature.args
        # run-time knobs (legacy_gemv.rows_dot8): prefetch distance in bytes, token grouping
        self.pf, self.mode = None, None
        if len(args) > 9:
            self.pf, self.mode = (context.cast(builder, args[i], at[i], types.int64) for i in (9, 10))
        xtarr = context.make_array(at[2])(context, builder, xta)
        self.xts = builder.extract_value(xtarr.shape, 1)
        xarr = context.make_array(at[3])(context, builder, xa)
        self.n = builder.extract_value(xarr.shape, 0)
        self.nblk = builder.extract_value(context.make_array(at[4])(context, builder, xda).shape, 1)
        yarr = context.make_array(at[7])(context, builder, ya)
        self.m = builder.extract_value(yarr.shape, 1)
        self.rp = vir.base_ptr(context, builder, at[0], ra, _i64(0))
        self.rowbytes = builder.extract_value(context.make_array(at[0])(context, builder, ra).shape, 0)
        # an all-true mask LLVM cannot prove all-true (the length's sign bit is 0): keeps masked loads unmerged
        sign = builder.trunc(builder.lshr(self.rowbytes, _i64(63)), ir.IntType(16))
        self.all_live = builder.icmp_unsigned("==", vir.splat(builder, sign, _V32W), ir.Constant(_V32W, None))
        self.xtp = builder.bitcast(xtarr.data, I8.as_pointer())
        self.xdp = vir.f32_ptr(context, builder, at[4], xda)
        self.xsp = builder.bitcast(context.make_array(at[5])(context, builder, xsa).data, I32.as_pointer())
        self.accp = vir.f32_ptr(context, builder, at[6], acca)  # [n, 8] lane accumulators
        self.yp = builder.bitcast(yarr.data, _F32.as_pointer())
        self.r64 = context.cast(builder, ri, at[8], types.intp)
        self.mload_f = _masked_load(builder, _V8F, "llvm.masked.load.v8f32.p0v8f32")
        self.mload_w = _masked_load(builder, _V32W, "llvm.masked.load.v32i16.p0v32i16")
        self.mload_i = _masked_load(builder, _V8I32, "llvm.masked.load.v8i32.p0v8i32")

    # ------------------------------------------------------------ driver

    def emit(self):
        b, eight = self.b, _i64(8)
        nfull = b.udiv(self.nblk, eight)
        with cgutils.for_range(b, nfull) as gl:
            self.group(gl.index, None, b.icmp_unsigned("==", gl.index, _i64(0)))
        rem = b.sub(self.nblk, b.mul(nfull, eight))
        with b.if_then(b.icmp_unsigned("!=", rem, _i64(0))):
            # 4 left (k = 640, 896, 1152: 2.5, 3.5, 4.5 groups) compiles its own code that reads 4 blocks, not 8
            with b.if_else(b.icmp_unsigned("==", rem, _i64(4))) as (four, other):
                with four:
                    self.group(nfull, 4, b.icmp_unsigned("==", nfull, _i64(0)))
                with other:
                    self.group(nfull, rem, b.icmp_unsigned("==", nfull, _i64(0)))
        with cgutils.for_range(b, self.n) as tl:
            t = tl.index
            lanes = b.load(b.bitcast(b.gep(self.accp, [b.mul(t, eight)]), _V8F.as_pointer()), align=4)
            b.store(tree8_lanes(b, lanes), b.gep(self.yp, [b.add(b.mul(t, self.m), self.r64)]))

    def group(self, grp, nvalid, first):
        """Lanes += the 8 block terms of group grp for every token. nvalid: None for a full
        group, else the number of real blocks (the rest are zero terms: x is zero-padded, d, c,
        xd, xs are masked to zero, and their weight reads are clamped into the row). A Python
        int nvalid is known at compile time: blocks past it are not read at all."""
        g = SimpleNamespace(grp=grp, nvalid=nvalid, first=first, b0=self.b.mul(grp, _i64(8)))
        if self.pf is not None:  # the lines pf bytes past this group's start (in the next rows at the end)
            b = self.b
            with b.if_then(b.icmp_signed(">", self.pf, _i64(0))):
                vir.prefetch_lines(b, self.rp, b.add(b.mul(g.b0, _i64(self.size)), self.pf), 8 * self.size)
        self.group_weights(g)
        self.group_scales(g)
        self.group_tokens(g)

    # ------------------------------------------------------------ one group's weights and scales

    def group_weights(self, g):
        """g.blks (i8* per block, None past a known end), g.lane_ok (<8 x i1>) and g.w: the 8
        blocks decoded once for every token, transposed so that vector j holds group j of each
        block: one vpdpbusd per group then sums whole blocks into lanes."""
        b, nvalid = self.b, g.nvalid
        g.nb = None
        if self.grouped and nvalid in (None, TAIL):  # stored transposed: a few loads and masks
            g.nb = GROUP if nvalid is None else TAIL
            if nvalid is not None:
                g.lane_ok = ir.Constant(_V8I1, [j < nvalid for j in range(8)])
            g.gp = b.gep(self.rp, [b.mul(g.b0, _i64(self.size))])
            g.w = [self._lanes8(w) for w in group_words(b, g.gp, self.layout, g.nb)]
            return
        if nvalid is None:
            bidx = [b.add(g.b0, _i64(j)) for j in range(8)]
        elif isinstance(nvalid, int):
            bidx = [b.add(g.b0, _i64(j)) if j < nvalid else None for j in range(8)]
            g.lane_ok = ir.Constant(_V8I1, [j < nvalid for j in range(8)])
        else:
            valid = [b.icmp_unsigned(">", nvalid, _i64(j)) for j in range(8)]
            bidx = [b.select(valid[j], b.add(g.b0, _i64(j)), g.b0) for j in range(8)]
            g.lane_ok = ir.Constant(_V8I1, ir.Undefined)
            for j in range(8):
                g.lane_ok = b.insert_element(g.lane_ok, valid[j], ir.Constant(I32, j))
        g.blks = [b.gep(self.rp, [b.mul(bj, _i64(self.size))]) if bj is not None else None for bj in bidx]
        g.w = transpose8x8(b, [b.bitcast(block_u8(b, blk, self.layout), _V8I32) if blk is not None else _ZERO8I
                               for blk in g.blks])

    def _lanes8(self, v):
        """<4 x T> -> <8 x T> with zero lanes 4-7 (a grouped last group of 4); <8 x T> as it is."""
        if v.type.count == 8:
            return v
        return self.b.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(_V8I32, list(range(8))))

    def _halves_wide(self, g):
        """halves(off) for a full group on VNNI hosts: the 8 blocks' bytes as 512-bit vectors of
        16-bit words, fp16 fields picked by two-source shuffles (vpermt2w) instead of 8 inserts
        each. Masked loads (the last one to the group's 4·size words): plain ones get merged by
        LLVM with the quant loads, which it then extracts from these vectors word by word."""
        b, size = self.b, self.size
        nwords = 4 * size
        nvec = (nwords + 31) // 32
        left = b.sub(self.rowbytes, b.mul(g.b0, _i64(size)))  # bytes to the row's end
        left = b.select(b.icmp_unsigned("<", left, _i64(2 * nwords)), left, _i64(2 * nwords))
        lim = b.trunc(b.sub(b.udiv(left, _i64(2)), _i64(32 * (nvec - 1))), ir.IntType(16))
        lanes32 = ir.Constant(_V32W, list(range(32)))
        wvecs = []
        for i in range(nvec):
            ptr = b.bitcast(b.gep(g.blks[0], [ir.Constant(I32, 64 * i)]), _V32W.as_pointer())
            live = self.all_live if i < nvec - 1 else b.icmp_signed("<", lanes32, vir.splat(b, lim, _V32W))
            wvecs.append(b.call(self.mload_w, [ptr, ir.Constant(I32, 1), live, ir.Constant(_V32W, None)]))
        if len(wvecs) % 2:
            wvecs.append(ir.Constant(_V32W, None))

        def halves(off):
            pos = [(size * j + off) // 2 for j in range(8)]
            out = None
            for q in range(len(wvecs) // 2):  # words 64q .. 64q+63
                mine = [p - 64 * q if 64 * q <= p < 64 * (q + 1) else 0 for p in pos]
                part = b.shuffle_vector(wvecs[2 * q], wvecs[2 * q + 1], ir.Constant(ir.VectorType(I32, 8), mine))
                if out is None:
                    out = part
                elif any(64 * q <= p < 64 * (q + 1) for p in pos):
                    take = [8 + j if 64 * q <= pos[j] < 64 * (q + 1) else j for j in range(8)]
                    out = b.shuffle_vector(out, part, ir.Constant(ir.VectorType(I32, 8), take))
            return b.bitcast(out, _V8H)

        return halves

    def _halves_each(self, g):
        """halves(off) from clamped block pointers: one fp16 load each."""
        b = self.b

        def halves(off):
            h = ir.Constant(_V8H, None)
            for j in range(8):
                if g.blks[j] is not None:
                    p = b.bitcast(b.gep(g.blks[j], [ir.Constant(I32, off)]), ir.HalfType().as_pointer())
                    h = b.insert_element(h, b.load(p, align=1), ir.Constant(I32, j))
            return h

        return halves

    def group_scales(self, g):
        """g.dv, g.cv <8 x float>: the 8 blocks' d and c (zero in lanes past nvalid)."""
        b = self.b
        if g.nb is not None:
            g.dv, g.cv = (self._lanes8(v) for v in group_scales(b, g.gp, self.layout, g.nb))
            return
        halves = self._halves_wide(g) if g.nvalid is None and vir.USE_VNNI else self._halves_each(g)
        g.dv = b.fpext(halves(0), _V8F)
        if self.moff >= 0:
            g.cv = b.fpext(halves(self.moff), _V8F)
        else:
            g.cv = b.fmul(g.dv, ir.Constant(_V8F, [self.cfix] * 8))
        if g.nvalid is not None:
            g.dv = b.select(g.lane_ok, g.dv, _ZERO8F)
            g.cv = b.select(g.lane_ok, g.cv, _ZERO8F)

    # ------------------------------------------------------------ every token of one group

    def group_tokens(self, g):
        b, n = self.b, self.n
        if g.nvalid is None:
            if not vir.USE_VNNI:
                self.each_token(g)
            elif self.mode is None:
                self.token_pairs(g)
            else:  # mode 1: one token per 256-bit dot (the same lanes, the same operations)
                with b.if_else(b.icmp_signed("==", self.mode, _i64(0))) as (pairs, single):
                    with pairs:
                        self.token_pairs(g)
                    with single:
                        self.each_token(g)
            return
        # a last group of <= 4 blocks: repack_groups8 packs token pairs into its lanes 0-3 and
        # 4-7, so one vpdpbusd serves two tokens. Lanes 4-7 of each token hold only zero terms,
        # and adding a zero to a lane (never -0.0: lanes start at +0.0) changes nothing, so
        # skipping them keeps the canonical order's result bit for bit.
        if isinstance(g.nvalid, int):
            packs = ir.Constant(_I1, g.nvalid <= 4)
        else:
            packs = b.icmp_unsigned("<=", g.nvalid, _i64(4))
        with b.if_else(packs) as (packed, spread):
            with packed:
                self.packed_pairs(g)
                with b.if_then(b.icmp_unsigned("!=", b.and_(n, _i64(1)), _i64(0))):
                    self.one_token(g, b.sub(n, _i64(1)))  # alone in its pair: partner lanes are zero
            with spread:
                self.each_token(g)

    def each_token(self, g):
        with cgutils.for_range(self.b, self.n) as tl:
            self.one_token(g, tl.index)

    def token_pairs(self, g):
        """Token pairs in 512-bit vectors (two_tokens), an odd last token alone."""
        b, n = self.b, self.n
        with cgutils.for_range(b, b.lshr(n, _i64(1))) as pl:
            self.two_tokens(g, b.shl(pl.index, _i64(1)))
        with b.if_then(b.icmp_unsigned("!=", b.and_(n, _i64(1)), _i64(0))):
            self.one_token(g, b.sub(n, _i64(1)))

    def scales(self, g, t):
        """xd, xs (as float) of token t's 8 blocks in this group."""
        b = self.b
        tb = b.add(b.mul(t, self.nblk), g.b0)
        xdq = b.bitcast(b.gep(self.xdp, [tb]), _V8F.as_pointer())
        xsq = b.bitcast(b.gep(self.xsp, [tb]), _V8I32.as_pointer())
        if g.nvalid is None:
            return b.load(xdq, align=4), b.load(xsq, align=4)
        # masked: no read past the token's row (or the array)
        return (b.call(self.mload_f, [xdq, ir.Constant(I32, 4), g.lane_ok, _ZERO8F]),
                b.call(self.mload_i, [xsq, ir.Constant(I32, 4), g.lane_ok, _ZERO8I]))

    def _group_dots(self, xg, weights, vty):
        """Σ_j dot(weights(j), x group j) (int32 lanes) over the 8 groups at i8* xg, in four
        chains (dependent vpdpbusd are latency-bound); vty the int32 vector type of one step."""
        b = self.b
        s = [ir.Constant(vty, None)] * 4
        for j in range(8):
            xv = b.load(b.bitcast(b.gep(xg, [ir.Constant(I32, 64 * j)]), vty.as_pointer()), align=1)
            s[j % 4] = vir.dpbusd(b, s[j % 4], weights(j), xv)
        return b.add(b.add(s[0], s[1]), b.add(s[2], s[3]))

    def _term(self, s, xdv, xsi, dv, cv):
        """The canonical block terms (legacy_blocks) of the int32 dots s: xd · (d · float(s - B·xs))
        for a symmetric type, else xd · (d · float(s) + c · float(xs))."""
        b = self.b
        vf = ir.VectorType(_F32, s.type.count)
        if self.bias:
            exact = b.sub(s, b.mul(xsi, ir.Constant(xsi.type, [self.bias] * s.type.count)))
            return b.fmul(xdv, b.fmul(dv, b.sitofp(exact, vf)))
        return b.fmul(xdv, b.fadd(b.fmul(dv, b.sitofp(s, vf)), b.fmul(cv, b.sitofp(xsi, vf))))

    def _add_term(self, g, t, s, xdv, xsi, dv, cv):
        """Token t's lanes (from accp[8t]) += the canonical terms of its int32 dots s; the lanes
        start at +0.0 in the first group."""
        b = self.b
        term = self._term(s, xdv, xsi, dv, cv)
        vf = term.type
        ap = b.bitcast(b.gep(self.accp, [b.mul(t, _i64(8))]), vf.as_pointer())
        prev = b.select(g.first, ir.Constant(vf, None), b.load(ap, align=4))
        b.store(b.fadd(prev, term), ap, align=4)

    def one_token(self, g, t):
        b = self.b
        # token t's group j: xt[t // 2, 512·grp + 64·j + 32·(t % 2)]
        half = b.mul(b.and_(t, _i64(1)), _i64(32))
        xg = b.gep(self.xtp, [b.add(b.add(b.mul(b.lshr(t, _i64(1)), self.xts), b.mul(g.grp, _i64(512))), half)])
        s = self._group_dots(xg, lambda j: g.w[j], _V8I32)
        xdv, xsi = self.scales(g, t)
        self._add_term(g, t, s, xdv, xsi, g.dv, g.cv)

    def two_tokens(self, g, t):
        """Tokens t, t+1 (t even) in one 512-bit vector each step: repack_groups8 stores the
        pair's group j side by side, and every lane computes what one_token's would."""
        b = self.b
        dup = ir.Constant(ir.VectorType(I32, 16), list(range(8)) * 2)
        xg = b.gep(self.xtp, [b.add(b.mul(b.lshr(t, _i64(1)), self.xts), b.mul(g.grp, _i64(512)))])
        s = self._group_dots(xg, lambda j: b.shuffle_vector(g.w[j], g.w[j], dup), ir.VectorType(I32, 16))
        (xd0, xs0), (xd1, xs1) = self.scales(g, t), self.scales(g, b.add(t, _i64(1)))
        xdv, xsi = _pair_of(b, xd0, xd1), _pair_of(b, xs0, xs1)
        dv2, cv2 = b.shuffle_vector(g.dv, g.dv, dup), b.shuffle_vector(g.cv, g.cv, dup)
        self._add_term(g, t, s, xdv, xsi, dv2, cv2)

    def packed_pairs(self, g):
        """Every token pair of a last group of <= 4 blocks: one 256-bit step per group serves both."""
        b = self.b
        v4f, v4i = ir.VectorType(_F32, 4), ir.VectorType(I32, 4)
        mload_f4 = _masked_load(b, v4f, "llvm.masked.load.v4f32.p0v4f32")
        mload_i4 = _masked_load(b, v4i, "llvm.masked.load.v4i32.p0v4i32")
        lo4, twice = ir.Constant(ir.VectorType(I32, 4), [0, 1, 2, 3]), ir.Constant(ir.VectorType(I32, 8), [0, 1, 2, 3, 0, 1, 2, 3])
        ok4 = b.shuffle_vector(g.lane_ok, ir.Constant(_V8I1, ir.Undefined), lo4)
        w2 = [b.shuffle_vector(wj, ir.Constant(_V8I32, ir.Undefined), twice) for wj in g.w]
        dv2 = b.shuffle_vector(g.dv, ir.Constant(_V8F, ir.Undefined), twice)
        cv2 = b.shuffle_vector(g.cv, ir.Constant(_V8F, ir.Undefined), twice)
        zero4f = ir.Constant(v4f, None)
        with cgutils.for_range(b, b.lshr(self.n, _i64(1))) as pl:
            xg = b.gep(self.xtp, [b.add(b.mul(pl.index, self.xts), b.mul(g.grp, _i64(512)))])
            s = self._group_dots(xg, lambda j: w2[j], _V8I32)
            t0 = b.shl(pl.index, _i64(1))
            toks = (t0, b.add(t0, _i64(1)))
            xd4, xs4 = [], []
            for t in toks:
                tb = b.add(b.mul(t, self.nblk), g.b0)
                xd4.append(b.call(mload_f4, [b.bitcast(b.gep(self.xdp, [tb]), v4f.as_pointer()), ir.Constant(I32, 4), ok4, zero4f]))
                xs4.append(b.call(mload_i4, [b.bitcast(b.gep(self.xsp, [tb]), v4i.as_pointer()), ir.Constant(I32, 4), ok4, ir.Constant(v4i, None)]))
            xdv, xsi = _pair_of(b, xd4[0], xd4[1]), _pair_of(b, xs4[0], xs4[1])
            term = self._term(s, xdv, xsi, dv2, cv2)
            for h, t in enumerate(toks):
                termh = b.shuffle_vector(term, ir.Constant(_V8F, ir.Undefined), ir.Constant(ir.VectorType(I32, 4), [4 * h + i for i in range(4)]))
                ap = b.gep(self.accp, [b.mul(t, _i64(8))])
                ap4 = b.bitcast(ap, v4f.as_pointer())
                prev = b.select(g.first, zero4f, b.load(ap4, align=4))  # lanes start at +0.0
                b.store(b.fadd(prev, termh), ap4, align=4)
                with b.if_then(g.first):  # lanes 4-7 are otherwise never written
                    b.store(zero4f, b.bitcast(b.gep(ap, [ir.Constant(I32, 4)]), v4f.as_pointer()), align=4)
