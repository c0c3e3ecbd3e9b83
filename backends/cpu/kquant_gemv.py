"""The K-quant / IQ4_XS gemv: two weight rows × 1, 2 or 4 tokens (rows_dot).

Each superblock of the two rows is unpacked once in registers (never stored) and multiplied, for
every token, as unsigned bytes by the signed activation bytes with one vpdpbusd per 64 elements;
the int32 lanes are summed exactly into per-block (per-16 for Q6_K / Q3_K / Q2_K) dots, and the
two rows' float work shares 16-lane vectors (8 blocks each, in _TREE_LANES order). The per-32 types
use a gemv layout of 4 blocks per vector (kquant_unpack's _il unpackers, the activations permuted
alike by interleave_blocks), so two vpdpbusd accumulate 4 blocks. Lane by lane the float work is
the gemm tile's (kquant_gemm_tile), so a token's output never depends on its batch.
"""

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from edged.backends.cpu.aligned import empty_aligned
from edged.backends.cpu.kquant_unpack import TYPES
from edged.backends.cpu.vector_ir import (
    F32, I32, I64, V8F, V16F, V16I32, V64I8, as_i64, base_ptr, dpbusd, emit_switch, ints, is_arr, load, loop,
    prefetch_lines, shuf, store, vec,
)

GEMV_TOKENS = 4  # most tokens per rows-dot call (the weights are unpacked once for all of them)


def _halve(builder, a, b):
    """Lane i of the result = lanes 2i + 2i+1 of concat(a, b) (integer adds: exact)."""
    n = a.type.count
    ev = shuf(builder, a, range(0, 2 * n, 2), b)
    od = shuf(builder, a, range(1, 2 * n, 2), b)
    return builder.add(ev, od)


def _group_sums(builder, d, levels):
    """Four 16-lane int32 vectors (64 lanes in order) -> sums of consecutive lane groups of size
    2**levels, in order (levels 2: 16 sums of 4 lanes; 3: 8 sums of 8 lanes)."""
    f01, f23 = _halve(builder, d[0], d[1]), _halve(builder, d[2], d[3])
    g = _halve(builder, f01, f23)  # 16 lanes, groups of 2**levels / 4
    if levels == 3:
        g = _halve(builder, shuf(builder, g, range(8)), shuf(builder, g, range(8, 16)))
    return g


# The block terms' lane order: lane L holds row L % 2's block (0, 4, 2, 6)[L % 8 // 2] + L // 8, so
# each level of the canonical tree adds a vector's upper half to its lower half (no lane permutes)
_TREE_LANES = [(L % 2, (0, 4, 2, 6)[L % 8 // 2] + L // 8) for L in range(16)]  # (row, block)
_TERM_PAIRS = [16 * r + 2 * b for r, b in _TREE_LANES]  # a per-16 pair's first lane in concat(row 0, row 1)
_TERM_BLOCKS = [b for _, b in _TREE_LANES]
_TERM_HALVES = [2 * b for b in _TERM_BLOCKS]  # a block's first per-16 half
_TERM_ROWS8 = [8 * r + b for r, b in _TREE_LANES]  # in concat of two rows' 8-lane vectors


def _tree8x2(builder, w):
    """The canonical superblock tree ((w0 + w1) + (w2 + w3)) + ((w4 + w5) + (w6 + w7)) of both
    rows' 8 block terms at once, w [16] in _TREE_LANES order -> 2 lanes (row 0, row 1): the gemm
    tile's adds, lane by lane."""
    p = builder.fadd(shuf(builder, w, range(8)), shuf(builder, w, range(8, 16)))  # [8]
    q = builder.fadd(shuf(builder, p, range(4)), shuf(builder, p, range(4, 8)))  # [4]
    return builder.fadd(shuf(builder, q, (0, 1)), shuf(builder, q, (2, 3)))  # [2]


def _pair_sums(builder, a, b, fadd):
    """[16] sums of the per-16 (or per-32 half) lane pairs of rows a, b (16 lanes each: block j's
    pair at lanes 2j, 2j + 1), in _TREE_LANES order."""
    ev = shuf(builder, a, _TERM_PAIRS, b)
    od = shuf(builder, a, [i + 1 for i in _TERM_PAIRS], b)
    return builder.fadd(ev, od) if fadd else builder.add(ev, od)


def _int_dots(builder, family, qv, xv):
    """[16] exact int32 sums of one row's superblock with one token: per-32 types 2 lanes per
    block (gemv layout: lanes 4i .. 4i+3 of chain h hold block 4h + i), per-16 types one per 16."""
    if family == "s32":
        z = ir.Constant(V16I32, None)
        a = [dpbusd(builder, dpbusd(builder, z, qv[2 * h], xv[2 * h]), qv[2 * h + 1], xv[2 * h + 1]) for h in range(2)]
        return _halve(builder, a[0], a[1])
    d = [dpbusd(builder, ir.Constant(V16I32, None), qv[j], xv[j]) for j in range(4)]
    return _group_sums(builder, d, 2)


def _block_terms(builder, family, g, rows, xav, xbv):
    """[16] float block terms of both rows' 8 blocks in _TREE_LANES order, op for op the gemm tile's:
    s16i  xd · (float(lo - B·X_lo) · s_lo + float(hi - B·X_hi) · s_hi)
    s16   (lo · (xd · s_lo) + hi · (xd · s_hi)) + (c_lo · xb_lo + c_hi · xb_hi)
    s32   S · (xd · s) + c · (xd · xs)."""
    if family == "s16i":
        xbi = builder.bitcast(xbv, V16I32)
        p = [builder.fmul(builder.sitofp(builder.sub(g[r], xbi), V16F), rows[r][0]) for r in range(2)]
        return builder.fmul(shuf(builder, xav, _TERM_HALVES), _pair_sums(builder, p[0], p[1], True))
    if family == "s16":
        p = [builder.fmul(builder.sitofp(g[r], V16F), builder.fmul(xav, rows[r][0])) for r in range(2)]
        q = [builder.fmul(rows[r][1], xbv) for r in range(2)]
        return builder.fadd(_pair_sums(builder, p[0], p[1], True), _pair_sums(builder, q[0], q[1], True))
    sums = builder.sitofp(_pair_sums(builder, g[0], g[1], False), V16F)  # [16] block dots
    s16 = shuf(builder, rows[0][0], _TERM_ROWS8, rows[1][0])
    c16 = shuf(builder, rows[0][1], _TERM_ROWS8, rows[1][1])
    v = builder.fmul(sums, builder.fmul(shuf(builder, xav, _TERM_BLOCKS), s16))
    return builder.fadd(v, builder.fmul(c16, shuf(builder, xbv, _TERM_BLOCKS)))


def _emit_rows_dot(context, builder, signature, args, kind, nt):
    """Two rows × nt tokens of type `kind` (arguments as rows_dot's, without kind and nt): a row's
    superblocks sbs (args[16]) bytes apart; with pf > 0 (args[15]) each superblock step
    prefetches both rows' bytes pf ahead."""
    bbytes, quants, _, scales, family = TYPES[kind]
    nf = 8 if family == "s32" else 16  # activation terms per superblock
    st = signature.args
    i64 = lambda k: as_i64(context, builder, args[k], st[k])  # noqa: E731
    c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    wps = [base_ptr(context, builder, st[0], args[0], i64(k)) for k in (1, 2)]
    tok = lambda k, off, stride, t: base_ptr(  # noqa: E731
        context, builder, st[k], args[k], builder.add(i64(off), builder.mul(i64(stride), c64(t))))
    xps = [tok(3, 4, 5, t) for t in range(nt)]
    xaps = [tok(6, 8, 9, t) for t in range(nt)]
    xbps = [tok(7, 8, 9, t) for t in range(nt)]
    vf = V8F if family == "s32" else V16F

    pf, sbs = i64(15), i64(16)
    wraw = base_ptr(context, builder, st[0], args[0], c64(0))

    def body(i, acc):
        with builder.if_then(builder.icmp_signed(">", pf, c64(0))):
            for k in (1, 2):
                prefetch_lines(builder, wraw, builder.add(builder.add(i64(k), builder.mul(i, sbs)), pf), bbytes)
        rows = []  # per row: (s, c, 4 chunks of unsigned weights), kept in registers
        for wp in wps:
            bp = builder.gep(wp, [builder.mul(i, sbs)])
            sc, cc = scales(builder, bp)
            rows.append((sc, cc, [quants(builder, bp, j) for j in range(4)]))
        fo = builder.mul(i, c64(4 * nf))
        new = []
        for t in range(nt):
            xbase = builder.gep(xps[t], [builder.mul(i, c64(256))])
            xv = [load(builder, xbase, 64 * j, V64I8) for j in range(4)]
            xav, xbv = load(builder, xaps[t], fo, vf), load(builder, xbps[t], fo, vf)
            g = [_int_dots(builder, family, qv, xv) for _, _, qv in rows]
            new.append(builder.fadd(acc[t], _tree8x2(builder, _block_terms(builder, family, g, rows, xav, xbv))))
        return new

    acc = loop(builder, i64(10), body, [ir.Constant(vec(F32, 2), None)] * nt)
    op = base_ptr(context, builder, st[11], args[11], ir.Constant(I64, 0))
    for t in range(nt):
        for r, k in enumerate((12, 13)):
            o = builder.add(i64(k), builder.mul(i64(14), c64(t)))
            store(builder, builder.extract_element(acc[t], ir.Constant(I32, r)), op, builder.mul(o, c64(4)))


@intrinsic
def _rows_dot(typingctx, kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride,
              pf, sbs):
    if not (is_arr(w, types.uint8) and is_arr(x, types.int8) and is_arr(xa, types.float32)
            and is_arr(xb, types.float32) and is_arr(out, types.float32)
            and ints(kind, nt, woff0, woff1, xoff, xstride, doff, dstride, nsb, o0, o1, ostride, pf, sbs)):
        return None
    sig = types.void(kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride, pf,
                     sbs)

    def codegen(context, builder, signature, args):
        sub, rest = signature.replace(args=signature.args[2:]), args[2:]

        def one_kind(k):
            emit_switch(builder, args[1], {
                t: (lambda t=t: _emit_rows_dot(context, builder, sub, rest, k, t)) for t in (1, 2, 4)})

        emit_switch(builder, args[0], {k: (lambda k=k: one_kind(k)) for k in TYPES})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def rows_dot(kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride, pf, sbs):
    """Dots of two rows of type `kind` (a KIND_* value; nsb superblocks from bytes woff0 / woff1 of
    w, a row's superblocks sbs bytes apart: the block size in GGUF's layout, twice it in
    kquant_pairs' pair layout; the rows may be the same) with nt (1, 2 or 4) tokens' int8
    activations (token t at element xoff + t·xstride of x; per-32 types: permuted by
    interleave_blocks), written to out's flat elements o0 + t·ostride / o1 + t·ostride. xa / xb
    float32 hold token t's activation terms from element doff + t·dstride on: per-32 types the
    block scales and scale × block sums [k/32]; per-16 types (Q6_K, Q3_K, Q2_K) per 16-half the
    block scale and scale × half sum [k/16] (Q6_K / Q3_K: the int32 bits of B × half sum). Each
    superblock is unpacked once for all nt tokens; `kind` and `nt` switch at run time between the
    18 compiled bodies. pf > 0 also prefetches the bytes pf past both rows' reads each step (a
    tuning knob: the same arithmetic)."""
    _rows_dot(kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, out, o0, o1, ostride, pf, sbs)


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
