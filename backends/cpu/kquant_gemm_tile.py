"""The K-quant / IQ4_XS gemm tile: TILE_ROWS decoded rows × one token tile (tile_dot).

Rows come from kquant_decode (unsigned bytes u, float scales s and biases c); the tile's int8
activations are 4-interleaved ([k/32][8 groups][nt tokens][4 bytes]) with broadcast weight words,
tokens in the lanes of one zmm (nt = 16) or ymm (nt = 8: as fast per token on hosts that split
512-bit ops in two), no horizontal sums; each activation vector load serves all TILE_ROWS rows.

Block terms (plain multiplies and adds, no FMA), per family (kquant_unpack.TYPES):
  s32   w_b = float(S_b) · (xd_b · s_b) + c_b · xb_b                    xb = xd · block sum
  s16   w_b = (float(lo) · (xd · s_lo) + float(hi) · (xd · s_hi)) + (c_lo · xb_lo + c_hi · xb_hi)
  s16i  w_b = xd · (float(lo - xb_lo) · s_lo + float(hi - xb_hi) · s_hi)  xb = int32 B · half sum
(S, lo, hi exact int32 dots of a block and its halves), then a pairwise tree over each
superblock's 8 terms ((w0+w1)+(w2+w3))+((w4+w5)+(w6+w7)), superblock sums added in sequence from
+0.0: the same operations in the same order as the gemv (kquant_gemv), so batch invariance holds.
"""

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edged.backends.cpu.kquant_unpack import TYPES
from edged.backends.cpu.vector_ir import (
    F32, I8, I32, I64, as_i64, base_ptr, dpbusd, emit_switch, ints, is_arr, load, loop, prefetch_lines, splat, store,
    vec,
)

TOKENS = 16  # tokens per gemm tile: one 512-bit vector of int32 / float32 lanes
TILE_ROWS = 4  # weight rows per tile_dot call: each activation vector load serves all of them


class _TileEmitter:
    """tile_dot's body for one family and tile width nt, emitted into (context, builder)."""

    def __init__(self, context, builder, signature, args, family, nt):
        self.b, self.nt = builder, nt
        self.per16, self.ibias = family != "s32", family == "s16i"
        st = signature.args
        self.i64 = lambda k: as_i64(context, builder, args[k], st[k])
        ptr = lambda k: base_ptr(context, builder, st[k], args[k], self.i64(k + 1))  # noqa: E731
        self.up, self.sp, self.cp, self.xp, self.xdp, self.xbp, self.op = (ptr(k) for k in (0, 3, 6, 9, 11, 13, 16))
        self.pfp, self.pfbytes = ptr(18), self.i64(20)  # raw weight bytes to prefetch (pfbytes 0: none)
        c64 = self.c64
        # per-row base pointers (strides in elements: bytes for u, 4-byte floats for s and c)
        self.ur = [builder.gep(self.up, [builder.mul(self.i64(2), c64(r))]) for r in range(TILE_ROWS)]
        self.sr = [builder.gep(self.sp, [builder.mul(self.i64(5), c64(4 * r))]) for r in range(TILE_ROWS)]
        self.cr = [builder.gep(self.cp, [builder.mul(self.i64(8), c64(4 * r))]) for r in range(TILE_ROWS)]
        self.nsc = self.nbias = 2 if self.per16 else 1
        self.vi, self.vf, self.vb = vec(I32, nt), vec(F32, nt), vec(I8, 4 * nt)
        self.zero_i, self.zero_f = ir.Constant(self.vi, None), ir.Constant(self.vf, None)

    @staticmethod
    def c64(v):
        return ir.Constant(I64, v)

    def fsplat(self, p, off):
        return splat(self.b, load(self.b, p, off, F32), self.vf)

    def int_dots(self, blk):
        """Per row, [nt] int32 dots of elements 0-15 (lo) and 16-31 (hi) of block blk."""
        b, c64, nt = self.b, self.c64, self.nt
        xb = b.gep(self.xp, [b.mul(blk, c64(32 * nt))])
        ub = b.mul(blk, c64(32))
        lo, hi = [self.zero_i] * TILE_ROWS, [self.zero_i] * TILE_ROWS
        for g in range(8):
            xv = load(b, xb, 4 * nt * g, self.vb)
            for r in range(TILE_ROWS):
                wword = load(b, self.ur[r], b.add(ub, c64(4 * g)), I32)
                wv = b.bitcast(splat(b, wword, self.vi), self.vb)
                if g < 4:
                    lo[r] = dpbusd(b, lo[r], wv, xv)
                else:
                    hi[r] = dpbusd(b, hi[r], wv, xv)
        return lo, hi

    def block_terms(self, blk):
        """Per-row [nt]-token vectors of the block term w_b (the module docstring's)."""
        b, c64, nt, vf, sr, cr = self.b, self.c64, self.nt, self.vf, self.sr, self.cr
        lo, hi = self.int_dots(blk)
        xd = load(b, self.xdp, b.mul(blk, c64(4 * nt)), vf)
        xbv = [load(b, self.xbp, b.add(b.mul(blk, c64(4 * nt * self.nbias)), c64(4 * nt * q)), vf)
               for q in range(self.nbias)]
        sb = b.mul(blk, c64(4 * self.nsc))
        cb = b.mul(blk, c64(4 * self.nbias))
        out = []
        if self.ibias:
            xbi = [b.bitcast(v, self.vi) for v in xbv]
            for r in range(TILE_ROWS):
                lo_f = b.sitofp(b.sub(lo[r], xbi[0]), vf)
                hi_f = b.sitofp(b.sub(hi[r], xbi[1]), vf)
                v = b.fadd(b.fmul(lo_f, self.fsplat(sr[r], sb)), b.fmul(hi_f, self.fsplat(sr[r], b.add(sb, c64(4)))))
                out.append(b.fmul(xd, v))
            return out
        for r in range(TILE_ROWS):
            if self.per16:
                v = b.fadd(b.fmul(b.sitofp(lo[r], vf), b.fmul(xd, self.fsplat(sr[r], sb))),
                           b.fmul(b.sitofp(hi[r], vf), b.fmul(xd, self.fsplat(sr[r], b.add(sb, c64(4))))))
            else:
                v = b.fmul(b.sitofp(b.add(lo[r], hi[r]), vf), b.fmul(xd, self.fsplat(sr[r], sb)))
            bias = b.fmul(self.fsplat(cr[r], cb), xbv[0])
            if self.per16:
                bias = b.fadd(bias, b.fmul(self.fsplat(cr[r], b.add(cb, c64(4))), xbv[1]))
            out.append(b.fadd(v, bias))
        return out

    def prefetch_part(self, i, nsb):
        """Superblock i's share of the pfbytes to prefetch: spread over the computation, the
        reads stream while it runs (in one burst at the rows' decode they stalled it)."""
        b, c64 = self.b, self.c64
        part = b.udiv(b.add(self.pfbytes, b.sub(b.mul(nsb, c64(64)), c64(1))), b.mul(nsb, c64(64)))  # lines
        with b.if_then(b.icmp_signed(">", self.pfbytes, c64(0))):
            with cgutils.for_range(b, part) as lp:
                prefetch_lines(b, self.pfp, b.mul(b.add(b.mul(part, i), lp.index), c64(64)), 64)

    def superblock(self, i, acc, nsb):
        """acc[r] + the tree of superblock i's 8 block terms, per row."""
        b, c64 = self.b, self.c64
        self.prefetch_part(i, nsb)
        b0 = b.mul(i, c64(8))
        w = [self.block_terms(b.add(b0, c64(j))) for j in range(8)]
        new = []
        for r in range(TILE_ROWS):
            t = [w[j][r] for j in range(8)]
            p = [b.fadd(t[2 * j], t[2 * j + 1]) for j in range(4)]
            tot = b.fadd(b.fadd(p[0], p[1]), b.fadd(p[2], p[3]))
            new.append(b.fadd(acc[r], tot))
        return new

    def emit(self):
        b = self.b
        nsb = b.udiv(self.i64(15), self.c64(8))
        acc = loop(b, nsb, lambda i, acc: self.superblock(i, acc, nsb), [self.zero_f] * TILE_ROWS)
        for r in range(TILE_ROWS):
            store(b, acc[r], self.op, 4 * self.nt * r)


# kinds sharing one compiled tile body per family
_FAMILY_KINDS = {}
for _kind, (*_, _family) in TYPES.items():
    _FAMILY_KINDS.setdefault(_family, []).append(_kind)


@intrinsic
def _tile_dot(typingctx, kind, nt, u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff,
              xbt, xboff, nblk, out, ooff, w, pfoff, pfbytes):
    if not (is_arr(u, types.uint8) and is_arr(s, types.float32) and is_arr(c, types.float32)
            and is_arr(xi, types.int8) and is_arr(xdt, types.float32) and is_arr(xbt, types.float32)
            and is_arr(out, types.float32) and is_arr(w, types.uint8)
            and ints(kind, nt, uoff, ustride, soff, sstride, coff, cstride, xioff, xdoff, xboff, nblk, ooff, pfoff,
                     pfbytes)):
        return None
    sig = types.void(kind, nt, u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff,
                     xbt, xboff, nblk, out, ooff, w, pfoff, pfbytes)

    def codegen(context, builder, signature, args):
        sub, rest = signature.replace(args=signature.args[2:]), args[2:]

        def one_family(fam):
            emit_switch(builder, args[1], {
                w: (lambda w=w: _TileEmitter(context, builder, sub, rest, fam, w).emit()) for w in (16, 8)})

        emit_switch(builder, args[0], {tuple(ks): (lambda f=f: one_family(f)) for f, ks in _FAMILY_KINDS.items()})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def tile_dot(kind, nt, u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
             nblk, out, ooff, w, pfoff, pfbytes):
    """TILE_ROWS decoded rows of type `kind` × one nt-token tile (nt 16 or 8) over nblk 32-blocks
    (a multiple of 8): out[ooff + nt·r + t] = Σ_b w_b (the module docstring's block term and
    order). Row r's u uint8 [nblk·32] starts at element uoff + r·ustride, its s and c float32
    ([nblk] per-32, [nblk][2] per-16) at soff + r·sstride, coff + r·cstride; xi int8 is the
    4-interleaved tile from xioff; xdt float32 [nblk][nt] activation scales from xdoff; xbt
    float32 [nblk][nt] (s32) or [nblk][2][nt] (s16, s16i as int32 bits) bias terms from xboff;
    c is not read for s16i. Nothing is bounds-checked. pfbytes > 0 prefetches that many bytes of
    w (uint8, any rank: the raw rows) from byte pfoff, a part in each superblock (a hint: it may
    point past w's end)."""
    _tile_dot(kind, nt, u, uoff, ustride, s, soff, sstride, c, coff, cstride, xi, xioff, xdt, xdoff, xbt, xboff,
              nblk, out, ooff, w, pfoff, pfbytes)
