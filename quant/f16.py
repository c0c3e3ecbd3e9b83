"""IEEE half / bfloat16 -> float32 from raw bytes inside Numba kernels.

Numba has little float16 support, so kernels read the two little-endian bytes of a scale field,
widen the bit pattern to float32 bits and reinterpret them. The conversion is exact and matches
numpy's `float16.astype(float32)` bit for bit, including ±0, subnormals, ±inf and NaN payloads.

Use from any njit kernel:
    d = f16_at(raw_row, byte_offset)         # float32 scale stored as fp16 at raw_row[byte_offset]
    x = f16_bits_to_f32(np.uint16(bits))     # from an already-assembled uint16
    x = bf16_bits_to_f32(np.uint16(bits))
"""

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic


@intrinsic
def _u32_as_f32(typingctx, bits):
    """Reinterpret a uint32 scalar's bits as float32 (an LLVM bitcast; no memory round trip)."""
    if bits != types.uint32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@nb.njit(cache=True, nogil=True, inline="always")
def f32_from_bits(bits):
    """float32 whose bit pattern is the uint32 `bits`."""
    return _u32_as_f32(np.uint32(bits))


@nb.njit(cache=True, nogil=True, inline="always")
def f16_bits_to_f32(h):
    """Exact float32 value of the IEEE binary16 bit pattern `h` (uint16)."""
    h32 = np.uint32(h)
    sign = (h32 & np.uint32(0x8000)) << np.uint32(16)
    exp = (h32 >> np.uint32(10)) & np.uint32(0x1F)
    mant = h32 & np.uint32(0x3FF)
    if exp == np.uint32(0x1F):
        # inf / NaN: keep the payload in the top mantissa bits, as numpy and the FPU do
        return f32_from_bits(sign | np.uint32(0x7F800000) | (mant << np.uint32(13)))
    if exp == np.uint32(0):
        if mant == np.uint32(0):
            return f32_from_bits(sign)  # ±0
        # subnormal: mant * 2^-24 is exact in float32 (always a normal float32)
        v = np.float32(mant) * np.float32(5.9604644775390625e-08)
        return -v if sign else v
    # normal: rebias exponent 15 -> 127
    return f32_from_bits(sign | ((exp + np.uint32(112)) << np.uint32(23)) | (mant << np.uint32(13)))


@nb.njit(cache=True, nogil=True, inline="always")
def bf16_bits_to_f32(h):
    """Exact float32 value of the bfloat16 bit pattern `h` (uint16): its top 16 bits."""
    return f32_from_bits(np.uint32(h) << np.uint32(16))


@nb.njit(cache=True, nogil=True, inline="always")
def u16_at(raw, off):
    """Little-endian uint16 from uint8 array `raw` at byte `off`."""
    return np.uint16(np.uint16(raw[off]) | (np.uint16(raw[off + 1]) << np.uint16(8)))


@nb.njit(cache=True, nogil=True, inline="always")
def f16_at(raw, off):
    """float32 value of the fp16 stored little-endian in uint8 array `raw` at byte `off`."""
    return f16_bits_to_f32(u16_at(raw, off))
