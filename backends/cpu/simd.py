"""SIMD primitives the integer matmul kernels need and LLVM will not find on its own.

row_dot (gemv): one raw weight row · one token; blocks decode in registers, 8 float lanes
accumulate, one horizontal sum per row. row_tile_dot / row_tile_dot_raw (gemm): one weight row ·
a 16-token tile whose int8 activations are laid out "4-interleaved" ([8 groups][16 tokens][4
bytes]) per block, giving 16 token lanes — no horizontal sum per token, which is what makes a
gemm tile cheap. On AVX-512 VNNI hosts the block dot is `vpdpbusd` with broadcast weights;
elsewhere portable LLVM vector IR (zext × sext, then sums of 4 lanes). The choice is made at
compile time from the host's features; Numba's on-disk cache keys on the CPU name and features,
so a cached kernel never runs on a host it was not built for.
"""

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

TOKENS = 16  # tokens per gemm tile: one 512-bit vector of int32 lanes
GROUPS = 8  # 4-byte groups in a 32-element block

# Read at codegen time; tests set it to False to compile the portable path on a VNNI host.
USE_VNNI = bool(llvm.get_host_cpu_features().get("avx512vnni", False))

_I32 = ir.IntType(32)
_I8 = ir.IntType(8)
_V16I32 = ir.VectorType(_I32, 16)
_V64I8 = ir.VectorType(_I8, 64)


def _byte_ptr(context, builder, arrty, arr, off):
    """i8* to element `off` of a 1-D uint8/int8 array."""
    ary = context.make_array(arrty)(context, builder, arr)
    base = builder.bitcast(ary.data, _I8.as_pointer())
    return builder.gep(base, [off])


def _vnni_block(builder, wp, xp, mask=None):
    """16 lanes of Σ_{32 bytes} w·x with vpdpbusd (w unsigned, broadcast; x signed); each 4-byte
    weight word is first XORed with `mask` (an i32 value) when given."""
    mod = builder.module
    fnty = ir.FunctionType(_V16I32, [_V16I32, _V16I32, _V16I32])
    fn = cgutils.get_or_insert_function(mod, fnty, "llvm.x86.avx512.vpdpbusd.512")
    # four independent accumulator chains: one chain of 8 dependent vpdpbusd is latency-bound
    accs = [ir.Constant(_V16I32, None)] * 4
    for g in range(GROUPS):
        wword = builder.load(builder.bitcast(builder.gep(wp, [ir.Constant(_I32, 4 * g)]), _I32.as_pointer()), align=1)
        if mask is not None:
            wword = builder.xor(wword, mask)  # scalar xor, then broadcast
        wvec = builder.insert_element(ir.Constant(_V16I32, ir.Undefined), wword, ir.Constant(_I32, 0))
        wvec = builder.shuffle_vector(wvec, ir.Constant(_V16I32, ir.Undefined), ir.Constant(_V16I32, [0] * 16))
        xptr = builder.bitcast(builder.gep(xp, [ir.Constant(_I32, 64 * g)]), _V16I32.as_pointer())
        xvec = builder.load(xptr, align=1)
        accs[g % 4] = builder.call(fn, [accs[g % 4], wvec, xvec])
    return builder.add(builder.add(accs[0], accs[1]), builder.add(accs[2], accs[3]))


def _generic_block(builder, wp, xp, mask=None):
    """Same result in target-independent vector IR."""
    v64i32 = ir.VectorType(_I32, 64)
    acc = ir.Constant(_V16I32, None)
    bcast = ir.Constant(ir.VectorType(_I32, 64), [q for _ in range(16) for q in range(4)])
    for g in range(GROUPS):
        wptr = builder.bitcast(builder.gep(wp, [ir.Constant(_I32, 4 * g)]), ir.VectorType(_I8, 4).as_pointer())
        w4 = builder.load(wptr, align=1)
        w64 = builder.shuffle_vector(w4, ir.Constant(ir.VectorType(_I8, 4), ir.Undefined), bcast)
        if mask is not None:
            w64 = builder.xor(w64, builder.bitcast(builder.shuffle_vector(builder.insert_element(ir.Constant(_V16I32, ir.Undefined), mask, ir.Constant(_I32, 0)), ir.Constant(_V16I32, ir.Undefined), ir.Constant(_V16I32, [0] * 16)), _V64I8))
        xptr = builder.bitcast(builder.gep(xp, [ir.Constant(_I32, 64 * g)]), _V64I8.as_pointer())
        x64 = builder.load(xptr, align=1)
        prod = builder.mul(builder.zext(w64, v64i32), builder.sext(x64, v64i32))
        undef = ir.Constant(v64i32, ir.Undefined)
        for q in range(4):
            lane = builder.shuffle_vector(prod, undef, ir.Constant(_V16I32, [4 * t + q for t in range(16)]))
            acc = builder.add(acc, lane)
    return acc


def _f32_ptr(context, builder, arrty, arr):
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.bitcast(ary.data, ir.FloatType().as_pointer())


@intrinsic
def _row_tile_dot(typingctx, u, ustride, uoff, umask, d, c, xi, xdt, xst, out):
    """out[t] = Σ_b xdt[b,t] · (d[b] · Σ_j u'[b,j]·x_t[32b+j] + c[b] · xst[b,t]) for 16 tokens t,
    u'[b, j] = u[b·ustride + uoff + j] ^ umask-byte."""
    f32a = lambda a: isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1  # noqa: E731
    ok = (
        isinstance(u, types.Array) and u.dtype == types.uint8 and u.ndim == 1
        and isinstance(xi, types.Array) and xi.dtype == types.int8 and xi.ndim == 1
        and f32a(d) and f32a(c) and f32a(xdt) and f32a(xst) and f32a(out)
        and all(isinstance(a, types.Integer) for a in (ustride, uoff, umask))
    )
    if not ok:
        return None
    sig = types.void(u, ustride, uoff, umask, d, c, xi, xdt, xst, out)

    def codegen(context, builder, signature, args):
        ua, us, uo, um, da, ca, xa, xda, xsa, oa = args
        sa = signature.args
        us = context.cast(builder, us, sa[1], types.intp)
        uo = context.cast(builder, uo, sa[2], types.intp)
        um = builder.trunc(context.cast(builder, um, sa[3], types.int64), _I32)
        mask = um  # i32, applied to each 4-byte weight word
        at = (sa[0],) + sa[4:]
        f32 = ir.FloatType()
        v16f = ir.VectorType(f32, 16)
        nblk = context.make_array(at[1])(context, builder, da).shape
        nblk = builder.extract_value(nblk, 0)
        up = _byte_ptr(context, builder, at[0], ua, uo)
        xp = _byte_ptr(context, builder, at[3], xa, ir.Constant(ir.IntType(64), 0))
        dp, cp = _f32_ptr(context, builder, at[1], da), _f32_ptr(context, builder, at[2], ca)
        xdp, xsp = _f32_ptr(context, builder, at[4], xda), _f32_ptr(context, builder, at[5], xsa)
        accp = cgutils.alloca_once_value(builder, ir.Constant(v16f, None))
        zero16 = ir.Constant(_V16I32, [0] * 16)
        with cgutils.for_range(builder, nblk) as loop:
            b = loop.index
            wb = builder.gep(up, [builder.mul(b, us)])
            xb = builder.gep(xp, [builder.mul(b, ir.Constant(b.type, 512))])
            s = _vnni_block(builder, wb, xb, mask) if USE_VNNI else _generic_block(builder, wb, xb, mask)
            sf = builder.sitofp(s, v16f)
            off16 = builder.mul(b, ir.Constant(b.type, 16))
            xdv = builder.load(builder.bitcast(builder.gep(xdp, [off16]), v16f.as_pointer()), align=4)
            xsv = builder.load(builder.bitcast(builder.gep(xsp, [off16]), v16f.as_pointer()), align=4)
            db = builder.load(builder.gep(dp, [b]))
            cb = builder.load(builder.gep(cp, [b]))
            dv = builder.shuffle_vector(builder.insert_element(ir.Constant(v16f, ir.Undefined), db, ir.Constant(_I32, 0)), ir.Constant(v16f, ir.Undefined), zero16)
            cv = builder.shuffle_vector(builder.insert_element(ir.Constant(v16f, ir.Undefined), cb, ir.Constant(_I32, 0)), ir.Constant(v16f, ir.Undefined), zero16)
            term = builder.fmul(xdv, builder.fadd(builder.fmul(dv, sf), builder.fmul(cv, xsv)))
            builder.store(builder.fadd(builder.load(accp), term), accp)
        builder.store(builder.load(accp), builder.bitcast(_f32_ptr(context, builder, at[6], oa), v16f.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def row_tile_dot(u, ustride, uoff, umask, d, c, xi, xdt, xst, out):
    """One weight row against one 16-token tile, over all k/32 blocks (accumulator in a register):
    out[t] = Σ_b xdt[16b+t] · (d[b] · Σ_{j<32} u'[b,j]·x_t[32b+j] + c[b] · xst[16b+t]).

    u' [b, j] = u[b·ustride + uoff + j] ^ (byte of umask): unsigned weight bytes, either a decoded
    row (ustride 32, uoff 0, umask 0) or raw blocks read in place (Q8_0: 34, 2, 0x80808080 turns
    its int8 into q + 128); d, c float32 [k/32] block scale and bias; xi int8 [k/32 · 512]
    4-interleaved tile; xdt, xst float32 [k/32 · 16] activation scales and sums; out float32 [16].
    Sizes are not checked: the caller guarantees them.
    """
    _row_tile_dot(u, ustride, uoff, umask, d, c, xi, xdt, xst, out)


# ---------------------------------------------------------------- gemv: one row · one token

# raw block layouts read in place by row_dot: (block bytes, quants offset, qh offset or -1, min offset or -1,
# nibbles?, bias offset for the symmetric types)
LAYOUTS = {
    0: (34, 2, -1, -1, False, -128.0),  # Q8_0: int8 q, read as q ^ 0x80
    1: (18, 2, -1, -1, True, -8.0),  # Q4_0
    2: (20, 4, -1, 2, True, 0.0),  # Q4_1: + min
    3: (22, 6, 2, -1, True, -16.0),  # Q5_0
    4: (24, 8, 4, 2, True, 0.0),  # Q5_1: + min
}


def _splat(builder, val, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _block_u8(builder, blk, layout):
    """<32 x i8> unsigned weight bytes of one raw block at i8* blk."""
    size, qoff, hoff, moff, nib, _ = layout
    v32i8 = ir.VectorType(_I8, 32)
    if not nib:
        q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, qoff)]), v32i8.as_pointer()), align=1)
        return builder.xor(q, ir.Constant(v32i8, [0x80] * 32))
    v16i8 = ir.VectorType(_I8, 16)
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, qoff)]), v16i8.as_pointer()), align=1)
    lo = builder.and_(q, ir.Constant(v16i8, [15] * 16))
    hi = builder.lshr(q, ir.Constant(v16i8, [4] * 16))
    u = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
    if hoff >= 0:  # fifth bits: bit j of the little-endian u32 qh adds 16 to element j
        v4i8 = ir.VectorType(_I8, 4)
        qh = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, hoff)]), v4i8.as_pointer()), align=1)
        hb = builder.shuffle_vector(qh, ir.Constant(v4i8, ir.Undefined), ir.Constant(ir.VectorType(_I32, 32), [j // 8 for j in range(32)]))
        hit = builder.icmp_unsigned("!=", builder.and_(hb, ir.Constant(v32i8, [1 << (j % 8) for j in range(32)])), ir.Constant(v32i8, [0] * 32))
        u = builder.or_(u, builder.select(hit, ir.Constant(v32i8, [16] * 32), ir.Constant(v32i8, [0] * 32)))
    return u


def _dot32(builder, u, x):
    """<8 x i32> partial sums of u (<32 x i8>, unsigned) · x (<32 x i8>, signed)."""
    v8i32 = ir.VectorType(_I32, 8)
    if USE_VNNI:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8i32, [v8i32] * 3), "llvm.x86.avx512.vpdpbusd.256")
        return builder.call(fn, [ir.Constant(v8i32, None), builder.bitcast(u, v8i32), builder.bitcast(x, v8i32)])
    v32i32 = ir.VectorType(_I32, 32)
    prod = builder.mul(builder.zext(u, v32i32), builder.sext(x, v32i32))
    undef = ir.Constant(v32i32, ir.Undefined)
    acc = None
    for q in range(4):
        lane = builder.shuffle_vector(prod, undef, ir.Constant(v8i32, [4 * t + q for t in range(8)]))
        acc = lane if acc is None else builder.add(acc, lane)
    return acc


@intrinsic
def _row_dot(typingctx, row, kind, xq, xd, xs):
    """Σ_b xd[b] · (d_b · Σ_j u_bj xq[32b+j] + c_b · xs[b]) over the raw blocks of one row."""
    ok = (
        isinstance(row, types.Array) and row.dtype == types.uint8 and row.ndim == 1
        and isinstance(kind, types.IntegerLiteral) and kind.literal_value in LAYOUTS
        and isinstance(xq, types.Array) and xq.dtype == types.int8 and xq.ndim == 1
        and isinstance(xd, types.Array) and xd.dtype == types.float32 and xd.ndim == 1
        and isinstance(xs, types.Array) and xs.dtype == types.int32 and xs.ndim == 1
    )
    if not ok:
        return None
    layout = LAYOUTS[kind.literal_value]
    sig = types.float32(row, kind, xq, xd, xs)

    def codegen(context, builder, signature, args):
        ra, _, xa, xda, xsa = args
        at = signature.args
        f32 = ir.FloatType()
        half = ir.HalfType()
        nblk = builder.extract_value(context.make_array(at[3])(context, builder, xda).shape, 0)
        rp = _byte_ptr(context, builder, at[0], ra, ir.Constant(ir.IntType(64), 0))
        xp = _byte_ptr(context, builder, at[2], xa, ir.Constant(ir.IntType(64), 0))
        xdp = _f32_ptr(context, builder, at[3], xda)
        xsp = builder.bitcast(context.make_array(at[4])(context, builder, xsa).data, _I32.as_pointer())
        accp = cgutils.alloca_once_value(builder, ir.Constant(f32, 0.0))
        size, _, _, moff, _, cfix = layout
        v8i32 = ir.VectorType(_I32, 8)
        reduce_add = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [v8i32]), "llvm.vector.reduce.add.v8i32")

        def f16(blk, off):
            p = builder.bitcast(builder.gep(blk, [ir.Constant(_I32, off)]), half.as_pointer())
            return builder.fpext(builder.load(p, align=1), f32)

        # Same per-block term and the same sequential float order as _row_tile_dot_raw (gemm):
        # a token's result does not depend on which kernel the batch size picked.
        with cgutils.for_range(builder, nblk) as loop:
            b = loop.index
            blk = builder.gep(rp, [builder.mul(b, ir.Constant(b.type, size))])
            u = _block_u8(builder, blk, layout)
            xv = builder.load(builder.bitcast(builder.gep(xp, [builder.mul(b, ir.Constant(b.type, 32))]), ir.VectorType(_I8, 32).as_pointer()), align=1)
            sf = builder.sitofp(builder.call(reduce_add, [_dot32(builder, u, xv)]), f32)  # exact int sum
            d = f16(blk, 0)
            xdb = builder.load(builder.gep(xdp, [b]))
            c = f16(blk, moff) if moff >= 0 else builder.fmul(d, ir.Constant(f32, cfix))
            xsb = builder.sitofp(builder.load(builder.gep(xsp, [b])), f32)
            term = builder.fmul(xdb, builder.fadd(builder.fmul(d, sf), builder.fmul(c, xsb)))
            builder.store(builder.fadd(builder.load(accp), term), accp)
        return builder.load(accp)

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def row_dot(row, kind, xq, xd, xs):
    """float32 Σ_j w_j·x_j for one raw row of 32-element blocks and one token's quantized x:
    Σ_b xd[b] · (d_b · Σ_j u_bj·xq[32b+j] + c_b · xs[b]). `kind` must be a compile-time constant,
    a key of LAYOUTS (0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1); the blocks decode in registers.
    Bit-identical to row_tile_dot_raw's lane for the same token (batch invariance). Sizes are not
    checked."""
    return _row_dot(row, kind, xq, xd, xs)


@intrinsic
def _row_tile_dot_raw(typingctx, row, kind, xi, xdt, xst, out):
    """row_tile_dot on a raw row of LAYOUTS[kind] blocks, decoded in registers."""
    f32a = lambda a: isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1  # noqa: E731
    ok = (
        isinstance(row, types.Array) and row.dtype == types.uint8 and row.ndim == 1
        and isinstance(kind, types.IntegerLiteral) and kind.literal_value in LAYOUTS
        and isinstance(xi, types.Array) and xi.dtype == types.int8 and xi.ndim == 1
        and f32a(xdt) and f32a(xst) and f32a(out)
    )
    if not ok:
        return None
    layout = LAYOUTS[kind.literal_value]
    sig = types.void(row, kind, xi, xdt, xst, out)

    def codegen(context, builder, signature, args):
        ra, _, xa, xda, xsa, oa = args
        at = signature.args
        f32 = ir.FloatType()
        half = ir.HalfType()
        v16f = ir.VectorType(f32, 16)
        v8i32 = ir.VectorType(_I32, 8)
        size, _, _, moff, _, cfix = layout
        nblk = builder.extract_value(context.make_array(at[3])(context, builder, xda).shape, 0)
        nblk = builder.udiv(nblk, ir.Constant(nblk.type, TOKENS))
        rp = _byte_ptr(context, builder, at[0], ra, ir.Constant(ir.IntType(64), 0))
        xp = _byte_ptr(context, builder, at[2], xa, ir.Constant(ir.IntType(64), 0))
        xdp, xsp = _f32_ptr(context, builder, at[3], xda), _f32_ptr(context, builder, at[4], xsa)
        accp = cgutils.alloca_once_value(builder, ir.Constant(v16f, None))
        fn = None
        if USE_VNNI:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16I32, [_V16I32] * 3), "llvm.x86.avx512.vpdpbusd.512")

        def f16(blk, off):
            p = builder.bitcast(builder.gep(blk, [ir.Constant(_I32, off)]), half.as_pointer())
            return builder.fpext(builder.load(p, align=1), f32)

        with cgutils.for_range(builder, nblk) as loop:
            b = loop.index
            blk = builder.gep(rp, [builder.mul(b, ir.Constant(b.type, size))])
            words = builder.bitcast(_block_u8(builder, blk, layout), v8i32)  # 8 groups of 4 unsigned bytes
            xb = builder.gep(xp, [builder.mul(b, ir.Constant(b.type, 512))])
            if USE_VNNI:
                accs = [ir.Constant(_V16I32, None)] * 4
                for g in range(GROUPS):
                    wv = _splat(builder, builder.extract_element(words, ir.Constant(_I32, g)), _V16I32)
                    xv = builder.load(builder.bitcast(builder.gep(xb, [ir.Constant(_I32, 64 * g)]), _V16I32.as_pointer()), align=1)
                    accs[g % 4] = builder.call(fn, [accs[g % 4], wv, xv])
                s = builder.add(builder.add(accs[0], accs[1]), builder.add(accs[2], accs[3]))
            else:
                tmp = cgutils.alloca_once(builder, v8i32)
                builder.store(words, tmp)
                s = _generic_block(builder, builder.bitcast(tmp, _I8.as_pointer()), xb)
            sf = builder.sitofp(s, v16f)
            d = f16(blk, 0)
            c = f16(blk, moff) if moff >= 0 else builder.fmul(d, ir.Constant(f32, cfix))
            off16 = builder.mul(b, ir.Constant(b.type, TOKENS))
            xdv = builder.load(builder.bitcast(builder.gep(xdp, [off16]), v16f.as_pointer()), align=4)
            xsv = builder.load(builder.bitcast(builder.gep(xsp, [off16]), v16f.as_pointer()), align=4)
            term = builder.fmul(xdv, builder.fadd(builder.fmul(_splat(builder, d, v16f), sf), builder.fmul(_splat(builder, c, v16f), xsv)))
            builder.store(builder.fadd(builder.load(accp), term), accp)
        builder.store(builder.load(accp), builder.bitcast(_f32_ptr(context, builder, at[5], oa), v16f.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def row_tile_dot_raw(row, kind, xi, xdt, xst, out):
    """row_tile_dot for one raw row of LAYOUTS[kind] blocks (kind a compile-time constant): the
    blocks and their fp16 scales are decoded in registers, so the row needs no decode pass."""
    _row_tile_dot_raw(row, kind, xi, xdt, xst, out)


@intrinsic
def _rows_dot_tokens(typingctx, row, kind, xq, xd, xs, y, r):
    """y[t, r] = row_dot(row, kind, xq[t], xd[t], xs[t]) for every token t, decoding each weight
    block once for all tokens (weight-stationary small-batch gemv); same float order per token."""
    ok = (
        isinstance(row, types.Array) and row.dtype == types.uint8 and row.ndim == 1
        and isinstance(kind, types.IntegerLiteral) and kind.literal_value in LAYOUTS
        and isinstance(xq, types.Array) and xq.dtype == types.int8 and xq.ndim == 2
        and isinstance(xd, types.Array) and xd.dtype == types.float32 and xd.ndim == 2
        and isinstance(xs, types.Array) and xs.dtype == types.int32 and xs.ndim == 2
        and isinstance(y, types.Array) and y.dtype == types.float32 and y.ndim == 2
        and isinstance(r, types.Integer)
    )
    if not ok:
        return None
    layout = LAYOUTS[kind.literal_value]
    sig = types.void(row, kind, xq, xd, xs, y, r)

    def codegen(context, builder, signature, args):
        ra, _, xa, xda, xsa, ya, ri = args
        at = signature.args
        f32 = ir.FloatType()
        half = ir.HalfType()
        i64 = ir.IntType(64)
        xarr = context.make_array(at[2])(context, builder, xa)
        n = builder.extract_value(xarr.shape, 0)
        k = builder.extract_value(xarr.shape, 1)
        nblk = builder.extract_value(context.make_array(at[3])(context, builder, xda).shape, 1)
        yarr = context.make_array(at[5])(context, builder, ya)
        m = builder.extract_value(yarr.shape, 1)
        rp = _byte_ptr(context, builder, at[0], ra, ir.Constant(i64, 0))
        xp = _byte_ptr(context, builder, at[2], xa, ir.Constant(i64, 0))
        xdp = _f32_ptr(context, builder, at[3], xda)
        xsp = builder.bitcast(context.make_array(at[4])(context, builder, xsa).data, _I32.as_pointer())
        yp = builder.bitcast(yarr.data, f32.as_pointer())
        r64 = context.cast(builder, ri, at[6], types.intp)
        size, _, _, moff, _, cfix = layout
        v8i32 = ir.VectorType(_I32, 8)
        reduce_add = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [v8i32]), "llvm.vector.reduce.add.v8i32")
        with cgutils.for_range(builder, n) as tl:  # y[t, r] = 0 for every token
            builder.store(ir.Constant(f32, 0.0), builder.gep(yp, [builder.add(builder.mul(tl.index, m), r64)]))

        def f16(blk, off):
            p = builder.bitcast(builder.gep(blk, [ir.Constant(_I32, off)]), half.as_pointer())
            return builder.fpext(builder.load(p, align=1), f32)

        with cgutils.for_range(builder, nblk) as loop:
            b = loop.index
            blk = builder.gep(rp, [builder.mul(b, ir.Constant(b.type, size))])
            u = _block_u8(builder, blk, layout)  # decoded once, used by every token
            d = f16(blk, 0)
            c = f16(blk, moff) if moff >= 0 else builder.fmul(d, ir.Constant(f32, cfix))
            with cgutils.for_range(builder, n) as tl:
                t = tl.index
                xv = builder.load(builder.bitcast(builder.gep(xp, [builder.add(builder.mul(t, k), builder.mul(b, ir.Constant(b.type, 32)))]), ir.VectorType(_I8, 32).as_pointer()), align=1)
                sf = builder.sitofp(builder.call(reduce_add, [_dot32(builder, u, xv)]), f32)
                tb = builder.add(builder.mul(t, nblk), b)
                xdb = builder.load(builder.gep(xdp, [tb]))
                xsb = builder.sitofp(builder.load(builder.gep(xsp, [tb])), f32)
                term = builder.fmul(xdb, builder.fadd(builder.fmul(d, sf), builder.fmul(c, xsb)))
                yptr = builder.gep(yp, [builder.add(builder.mul(t, m), r64)])
                builder.store(builder.fadd(builder.load(yptr), term), yptr)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def rows_dot_tokens(row, kind, xq, xd, xs, y, r):
    """Column r of y [n, m] for one raw weight row and all n tokens of (xq, xd, xs): each block is
    decoded once for every token; per token bit-identical to row_dot (and so to gemm)."""
    _rows_dot_tokens(row, kind, xq, xd, xs, y, r)
