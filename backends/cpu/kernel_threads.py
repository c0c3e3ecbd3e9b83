"""The thread-count knob of the matmul kernels, applied inside the kernel: numba's set_num_threads
costs microseconds from Python (a lock and checks a call), and inside a kernel it embeds a ctypes
pointer, which stops Numba caching the kernel. These call the threading layer's get_num_threads /
set_num_threads by symbol name, as Numba's parallel loops do, so kernels stay cacheable."""

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from numba.np.ufunc.parallel import _launch_threads

# registers the layer's symbols with LLVM before any cached kernel that calls them is linked
_launch_threads()

# an elementwise or per-row op over at most this many elements runs in the calling thread: a decode
# step's few rows are less work than starting the thread pool (docs/kernels.md, "Small ops at decode")
SERIAL_ELEMENTS = 16384
# the gemms prepare their token tiles in the calling thread up to this many tile bytes: a 16-token
# tile of k = 640 took 7.5 us on the thread pool (2.8 of it starting the pool), 2.4 us here
SERIAL_TILE_BYTES = 32768


def runs_serial(a) -> bool:
    """Whether an op over array `a` runs in the calling thread (SERIAL_ELEMENTS)."""
    return a.size <= SERIAL_ELEMENTS

# declared as Numba's parallel loops declare get_num_threads (intp), which share the module (the C
# functions take and return int: the low half of the register)
_INTP = cgutils.intp_t


@intrinsic
def _get_threads(typingctx):
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_INTP, []), "get_num_threads")
        return builder.call(fn, [])

    return types.intp(), codegen


@intrinsic
def _set_threads(typingctx, n):
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_INTP]), "set_num_threads")
        builder.call(fn, [context.cast(builder, args[0], signature.args[0], types.intp)])
        return context.get_dummy_value()

    return types.void(n), codegen


@nb.njit(cache=True, nogil=True, inline="always")
def current_threads():
    """The threads this thread's next parallel region runs on (numba.get_num_threads, cacheable)."""
    return _get_threads()


@nb.njit(cache=True, nogil=True, inline="always")
def fewer_threads(threads):
    """Run this thread's next parallel regions on `threads` threads when that is fewer than now (0:
    unchanged); returns the count restore_threads puts back."""
    prev = _get_threads()
    if 0 < threads < prev:
        _set_threads(threads)
    return prev


@nb.njit(cache=True, nogil=True, inline="always")
def restore_threads(prev):
    if _get_threads() != prev:
        _set_threads(prev)
