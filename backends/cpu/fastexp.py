"""A vectorizable float32 exp for softmax: LLVM cannot vectorize libm's expf calls (no SVML here),
and scalar expf dominated decode attention's softmax pass."""

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_FM = {"reassoc", "contract", "nsz", "arcp"}
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # ln 2 split so n * LN2_HI is exact in float32
_LN2_LO = np.float32(-2.12194440e-4)


@intrinsic
def _bits_as_f32(typingctx, x):
    """Reinterpret int32 bits as float32 (builds 2^n directly from its exponent field)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _floor_f32(typingctx, x):
    """llvm.floor.f32 of a float32: math.floor returns an integer (a round trip through int64)
    and, outside a parallel loop, lowers to a libm call that keeps the loop scalar."""
    if x != types.float32:
        return None
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.floor", [ir.FloatType()])
        return builder.call(fn, [args[0]])

    return sig, codegen


@nb.njit(inline="always", fastmath=_FM)
def exp_nonpos(x):
    """e^x for float32 x <= 0 (softmax after subtracting the max); relative error < 4e-7.

    Inputs below -87 return ~1.2e-38 instead of underflowing further, which a softmax cannot see.
    """
    x = max(x, np.float32(-87.0))
    n = _floor_f32(x * _LOG2E + np.float32(0.5))
    r = (x - n * _LN2_HI) - n * _LN2_LO  # |r| <= ln2 / 2
    # Cephes expf minimax polynomial on [-ln2/2, ln2/2]
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    y = p * r * r + r + np.float32(1.0)
    return y * _bits_as_f32(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))
