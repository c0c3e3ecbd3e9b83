"""64-byte-aligned scratch arrays for the SIMD kernels.

Numba's np.empty aligns to 32 bytes only, so a 512-bit load from such a buffer straddles two cache
lines half the time, depending on where the allocator put it: a kernel's speed then changed from
one process to the next. Every buffer read with 64-byte vector loads comes from here.
"""

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

ALIGN = 64


@intrinsic
def _gap_to_line(typingctx, buf):
    """Bytes from buf's data pointer up to the next multiple of ALIGN (0 if aligned)."""
    if not (isinstance(buf, types.Array) and buf.ndim == 1):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        addr = builder.ptrtoint(ary.data, ir.IntType(64))
        return builder.and_(builder.neg(addr), ir.Constant(ir.IntType(64), ALIGN - 1))

    return types.intp(buf), codegen


@nb.njit(cache=True, nogil=True)
def empty_aligned(rows, cols, dtype):
    """Uninitialized C-contiguous [rows, cols] array of `dtype` whose data starts on a 64-byte line."""
    itemsize = np.empty(0, dtype).itemsize
    nbytes = rows * cols * itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    off = _gap_to_line(buf)
    return buf[off : off + nbytes].view(dtype).reshape((rows, cols))
