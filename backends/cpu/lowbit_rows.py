"""IR of the low-bit types' row kernels: the gemv's two rows × 1, 2 or 4 tokens (rows_dot) and the
gemm's row decoder (decode_row), over lowbit_unpack's superblocks.

Both are kquant_gemv's and kquant_decode's kernels on another type table: the gemv's integer dots,
block terms and superblock tree are kquant_gemv's (op for op the gemm tile's, kquant_gemm_tile, so
a token's output never depends on its batch), and decode_row writes the (u, s, c) rows that
kquant_gemm_tile.tile_dot multiplies. New here is a row ending inside a superblock (MXFP4, whose
blocks are 32 elements): its tail bytes are copied into a zeroed superblock on the stack and
unpacked like the others; zero bytes decode to finite scales, and the activations there are zero,
so the padding adds +0.0 terms alike in the gemv and the gemm.
"""

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edged.backends.cpu.kquant_gemv import _block_terms, _int_dots, _tree8x2
from edged.backends.cpu.lowbit_unpack import TYPES
from edged.backends.cpu.vector_ir import (
    F32, I8, I32, I64, V8F, V16F, V64I8, as_i64, base_ptr, emit_switch, ints, is_arr, load, loop, store, vec,
)


def _with_tail(builder, sbytes, row_ptrs, nsb, tail, step, acc):
    """acc after step(nsb, pointers) on the rows' tail superblocks (tail bytes, 0: none), each
    copied from row_ptrs[r] + nsb·sbytes into a zeroed superblock-sized stack buffer."""
    slots = [cgutils.alloca_once_value(builder, a) for a in acc]
    bufs = [cgutils.alloca_once(builder, ir.ArrayType(I8, sbytes)) for _ in row_ptrs]
    with builder.if_then(builder.icmp_unsigned("!=", tail, ir.Constant(I64, 0)), likely=False):
        ptrs = []
        for buf, rp in zip(bufs, row_ptrs):
            p = builder.bitcast(buf, I8.as_pointer())
            cgutils.memset(builder, p, ir.Constant(I64, sbytes), 0)
            cgutils.raw_memcpy(builder, p, builder.gep(rp, [builder.mul(nsb, ir.Constant(I64, sbytes))]), tail, 1)
            ptrs.append(p)
        for s, v in zip(slots, step(nsb, ptrs, [builder.load(s) for s in slots])):
            builder.store(v, s)
    return [builder.load(s) for s in slots]


# ------------------------------------------------------------------------------- gemv


def _emit_rows_dot(context, builder, signature, args, kind, nt):
    """Two rows × nt tokens of type `kind` (arguments as rows_dot's, without kind and nt)."""
    sbytes, quants, _, scales, family, has_tail = TYPES[kind]
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
    ifam = "s32" if family == "s32" else "s16"  # _int_dots: "s32" reads the gemv layout, else per-16 dots

    def step(i, bps, acc):
        rows = []  # per row: (s, c, 4 chunks of unsigned weights), kept in registers
        for bp in bps:
            sc, cc = scales(builder, bp)
            rows.append((sc, cc, [quants(builder, bp, j) for j in range(4)]))
        fo = builder.mul(i, c64(4 * nf))
        new = []
        for t in range(nt):
            xbase = builder.gep(xps[t], [builder.mul(i, c64(256))])
            xv = [load(builder, xbase, 64 * j, V64I8) for j in range(4)]
            xav, xbv = load(builder, xaps[t], fo, vf), load(builder, xbps[t], fo, vf)
            g = [_int_dots(builder, ifam, qv, xv) for _, _, qv in rows]
            new.append(builder.fadd(acc[t], _tree8x2(builder, _block_terms(builder, family, g, rows, xav, xbv))))
        return new

    nsb = i64(10)
    acc = loop(builder, nsb, lambda i, a: step(i, [builder.gep(wp, [builder.mul(i, c64(sbytes))]) for wp in wps], a),
               [ir.Constant(vec(F32, 2), None)] * nt)
    if has_tail:
        acc = _with_tail(builder, sbytes, wps, nsb, i64(11), step, acc)
    op = base_ptr(context, builder, st[12], args[12], ir.Constant(I64, 0))
    for t in range(nt):
        for r, k in enumerate((13, 14)):
            o = builder.add(i64(k), builder.mul(i64(15), c64(t)))
            store(builder, builder.extract_element(acc[t], ir.Constant(I32, r)), op, builder.mul(o, c64(4)))


@intrinsic
def _rows_dot(typingctx, kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, tail, out, o0, o1,
              ostride):
    if not (is_arr(w, types.uint8) and is_arr(x, types.int8) and is_arr(xa, types.float32)
            and is_arr(xb, types.float32) and is_arr(out, types.float32)
            and ints(kind, nt, woff0, woff1, xoff, xstride, doff, dstride, nsb, tail, o0, o1, ostride)):
        return None
    sig = types.void(kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, tail, out, o0, o1,
                     ostride)

    def codegen(context, builder, signature, args):
        sub, rest = signature.replace(args=signature.args[2:]), args[2:]

        def one_kind(k):
            emit_switch(builder, args[1], {
                t: (lambda t=t: _emit_rows_dot(context, builder, sub, rest, k, t)) for t in (1, 2, 4)})

        emit_switch(builder, args[0], {k: (lambda k=k: one_kind(k)) for k in TYPES})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def rows_dot(kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, tail, out, o0, o1, ostride):
    """kquant_gemv.rows_dot for lowbit_unpack's types: two rows (nsb whole superblocks and `tail`
    more bytes at byte woff0 / woff1 of w) · nt (1, 2, 4) tokens, written to out's flat elements
    o0 + t·ostride / o1 + t·ostride. Token t's int8 activations start at element xoff + t·xstride
    of x (per-32 types: permuted by kquant_gemv.interleave_blocks), its terms at doff + t·dstride
    of xa / xb (per-32: scales, scale × block sums; IQ1_M: per-16 scales and int32 bits of
    9 × half sums); a tail superblock's activations must be zero past the row's end."""
    _rows_dot(kind, nt, w, woff0, woff1, x, xoff, xstride, xa, xb, doff, dstride, nsb, tail, out, o0, o1, ostride)


# ------------------------------------------------------------------------------- gemm rows


def _emit_decode_row(context, builder, signature, args, kind):
    sbytes, _, quants, scales, family, has_tail = TYPES[kind]
    nscales = 8 if family == "s32" else 16
    st = signature.args
    i64 = lambda k: as_i64(context, builder, args[k], st[k])  # noqa: E731
    wp, up, sp, cp = (base_ptr(context, builder, st[k], args[k], i64(k + 1)) for k in (0, 4, 6, 8))

    def step(i, bps, acc):
        bp = bps[0]
        ub = builder.gep(up, [builder.mul(i, ir.Constant(I64, 256))])
        fo = builder.mul(i, ir.Constant(I64, 4 * nscales))
        sv, cv = scales(builder, bp)
        store(builder, sv, sp, fo)
        store(builder, cv, cp, fo)
        for j in range(4):
            store(builder, quants(builder, bp, j), ub, 64 * j)
        return acc

    nsb = i64(2)
    loop(builder, nsb, lambda i, a: step(i, [builder.gep(wp, [builder.mul(i, ir.Constant(I64, sbytes))])], a), [])
    if has_tail:
        _with_tail(builder, sbytes, [wp], nsb, i64(3), step, [])


@intrinsic
def _decode_row(typingctx, kind, w, woff, nsb, tail, u, uoff, s, soff, c, coff):
    if not (is_arr(w, types.uint8) and is_arr(u, types.uint8) and is_arr(s, types.float32)
            and is_arr(c, types.float32) and ints(kind, woff, nsb, tail, uoff, soff, coff)):
        return None
    sig = types.void(kind, w, woff, nsb, tail, u, uoff, s, soff, c, coff)

    def codegen(context, builder, signature, args):
        sub, rest = signature.replace(args=signature.args[1:]), args[1:]
        emit_switch(builder, args[0], {
            k: (lambda k=k: _emit_decode_row(context, builder, sub, rest, k)) for k in TYPES})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def decode_row(kind, w, woff, nsb, tail, u, uoff, s, soff, c, coff):
    """One row of type `kind` (nsb whole superblocks and `tail` more bytes at byte woff of w) ->
    unsigned weights u uint8 [256 per superblock, a tail one included] from element uoff, and
    per-32 ([8] per superblock) or IQ1_M's per-16 ([16]) float32 scales s from soff and biases c
    from coff, w_e = s · u_e + c (lowbit_unpack's u and offsets)."""
    _decode_row(kind, w, woff, nsb, tail, u, uoff, s, soff, c, coff)
