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


def _vnni_block(builder, wp, xp):
    """16 lanes of Σ_{32 bytes} w·x with vpdpbusd (w unsigned, broadcast; x signed)."""
    mod = builder.module
    fnty = ir.FunctionType(_V16I32, [_V16I32, _V16I32, _V16I32])
    fn = cgutils.get_or_insert_function(mod, fnty, "llvm.x86.avx512.vpdpbusd.512")
    acc = ir.Constant(_V16I32, None)
    for g in range(GROUPS):
        wword = builder.load(builder.bitcast(builder.gep(wp, [ir.Constant(_I32, 4 * g)]), _I32.as_pointer()), align=1)
        wvec = builder.insert_element(ir.Constant(_V16I32, ir.Undefined), wword, ir.Constant(_I32, 0))
        wvec = builder.shuffle_vector(wvec, ir.Constant(_V16I32, ir.Undefined), ir.Constant(_V16I32, [0] * 16))
        xptr = builder.bitcast(builder.gep(xp, [ir.Constant(_I32, 64 * g)]), _V16I32.as_pointer())
        xvec = builder.load(xptr, align=1)
        acc = builder.call(fn, [acc, wvec, xvec])
    return acc


def _generic_block(builder, wp, xp):
    """Same result in target-independent vector IR."""
    v64i32 = ir.VectorType(_I32, 64)
    acc = ir.Constant(_V16I32, None)
    bcast = ir.Constant(ir.VectorType(_I32, 64), [q for _ in range(16) for q in range(4)])
    for g in range(GROUPS):
        wptr = builder.bitcast(builder.gep(wp, [ir.Constant(_I32, 4 * g)]), ir.VectorType(_I8, 4).as_pointer())
        w4 = builder.load(wptr, align=1)
        w64 = builder.shuffle_vector(w4, ir.Constant(ir.VectorType(_I8, 4), ir.Undefined), bcast)
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


@nb.njit(cache=True, nogil=True, parallel=True)
def interleave_x16(xq, n0, n1, out):
    """Tokens n0:n1 of xq int8 [n, k] -> out int8 [k/32, 8, 16, 4] (missing tokens zero)."""
    k = xq.shape[1]
    nblk = k // 32
    for b in nb.prange(nblk):
        for g in range(GROUPS):
            for t in range(TOKENS):
                tok = n0 + t
                for q in range(4):
                    out[b, g, t, q] = xq[tok, b * 32 + g * 4 + q] if tok < n1 else np.int8(0)
