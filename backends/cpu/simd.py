"""One SIMD primitive the batched integer kernels need and LLVM will not find on its own.

`dot_u8i8_x16` multiplies one block of 32 unsigned weight bytes by the same block of 16 tokens'
int8 activations laid out "4-interleaved" ([8 groups][16 tokens][4 bytes]) and returns the 16
int32 dot products in lanes — no horizontal sum per token, which is what makes a gemm tile cheap.
On AVX-512 VNNI hosts it is 8 `vpdpbusd` with broadcast weights; elsewhere it is portable LLVM
vector IR (zext × sext, then sums of 4 lanes). The choice is made at compile time from the host's
features; Numba's on-disk cache keys on the CPU name and features, so a cached kernel never runs
on a host it was not built for.
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


@intrinsic
def _dot_u8i8_x16(typingctx, w, woff, x, xoff, s):
    """s[0:16] = Σ_j w[woff+j] * x[xoff + (j//4)*64 + t*4 + j%4] for t < 16, j < 32."""
    ok = (
        isinstance(w, types.Array) and w.dtype == types.uint8 and w.ndim == 1
        and isinstance(x, types.Array) and x.dtype == types.int8 and x.ndim == 1
        and isinstance(s, types.Array) and s.dtype == types.int32 and s.ndim == 1
        and isinstance(woff, types.Integer) and isinstance(xoff, types.Integer)
    )
    if not ok:
        return None
    sig = types.void(w, woff, x, xoff, s)

    def codegen(context, builder, signature, args):
        warr, wo, xarr, xo, sarr = args
        wo = context.cast(builder, wo, signature.args[1], types.intp)
        xo = context.cast(builder, xo, signature.args[3], types.intp)
        wp = _byte_ptr(context, builder, signature.args[0], warr, wo)
        xp = _byte_ptr(context, builder, signature.args[2], xarr, xo)
        acc = _vnni_block(builder, wp, xp) if USE_VNNI else _generic_block(builder, wp, xp)
        sary = context.make_array(signature.args[4])(context, builder, sarr)
        builder.store(acc, builder.bitcast(sary.data, _V16I32.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def dot_u8i8_x16(w, woff, x, xoff, s):
    """int32 s[16] = one 32-element block: unsigned w[woff:woff+32] · 16 tokens of 4-interleaved x.

    x holds the block at x[xoff : xoff + 512] as [8 groups][16 tokens][4 bytes]; w and x must have
    those bytes in bounds (not checked); s must have 16 elements.
    """
    _dot_u8i8_x16(w, woff, x, xoff, s)


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
