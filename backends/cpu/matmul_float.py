"""Matmul kernels for float weights: F32, F16, BF16 (float32 activations, float32 accumulation).

Contract (backends/cpu/matmul.py): f(w_rows uint8 [m, row_bytes], x float32 [n, k], y float32 [n, m]).
Rows are widened to float32 once per row (F16/BF16 through quant/f16's exact bit conversions,
which LLVM vectorizes), then dotted with fastmath so the reductions vectorize. gemm holds a tile
of ROWS rows: each activation load feeds ROWS accumulators and each widened row is reused by
every token.
"""

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from edged.quant.f16 import bf16_bits_to_f32, f16_bits_to_f32

# The hardware half->float conversion (vcvtph2ps) vectorizes 10x better than quant/f16's bit
# arithmetic; LLVM needs F16C for it on x86 (elsewhere it may call a runtime helper Numba lacks).
_HW_F16 = bool(llvm.get_host_cpu_features().get("f16c", False))


@intrinsic
def _f16_hw(typingctx, h):
    """float32 of the binary16 bit pattern h (uint16) by an IEEE fpext (exact, like numpy)."""
    if h != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@nb.njit(cache=True, nogil=True, inline="always")
def _f16_to_f32(h):
    if _HW_F16:
        return _f16_hw(h)
    return f16_bits_to_f32(h)

_F32, _F16, _BF16 = 0, 1, 2
# reassociation lets the reductions vectorize; no nnan/ninf: inf/NaN weights must propagate
_FAST = {"reassoc", "contract", "nsz"}
ROWS = 4  # gemm row tile
ROWS_PER_TASK = 16  # gemv rows per prange step (amortizes the scratch row)


@nb.njit(nogil=True, cache=True, fastmath=_FAST, inline="always")
def _widen(kind, w, r, buf):
    """Row r of w (uint8 [m, row_bytes]) as float32 into buf [k]."""
    k = buf.shape[0]
    if kind == _F32:
        f = w[r].view(np.float32)
        for j in range(k):
            buf[j] = f[j]
    elif kind == _F16:
        h = w[r].view(np.uint16)
        for j in range(k):
            buf[j] = _f16_to_f32(h[j])
    else:
        h = w[r].view(np.uint16)
        for j in range(k):
            buf[j] = bf16_bits_to_f32(h[j])


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FAST)
def _gemv(kind, w, x, y):
    m = w.shape[0]
    n, k = x.shape
    for task in nb.prange((m + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        buf = np.empty(k, np.float32)  # [k] one widened row
        for r in range(task * ROWS_PER_TASK, min(m, (task + 1) * ROWS_PER_TASK)):
            _widen(kind, w, r, buf)
            for t in range(n):
                acc = np.float32(0.0)
                for j in range(k):
                    acc += buf[j] * x[t, j]
                y[t, r] = acc


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FAST)
def _gemm(kind, w, x, y):
    m = w.shape[0]
    n, k = x.shape
    for task in nb.prange((m + ROWS - 1) // ROWS):
        buf = np.zeros((ROWS, k), np.float32)  # [ROWS, k] widened rows; missing rows stay zero
        r0 = task * ROWS
        nr = min(ROWS, m - r0)
        for i in range(nr):
            _widen(kind, w, r0 + i, buf[i])
        b0, b1, b2, b3 = buf[0], buf[1], buf[2], buf[3]
        for t in range(n):
            xt = x[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for j in range(k):
                xv = xt[j]
                a0 += b0[j] * xv
                a1 += b1[j] * xv
                a2 += b2[j] * xv
                a3 += b3[j] * xv
            y[t, r0] = a0
            if nr > 1:
                y[t, r0 + 1] = a1
            if nr > 2:
                y[t, r0 + 2] = a2
            if nr > 3:
                y[t, r0 + 3] = a3


@nb.njit(nogil=True, cache=True)
def gemv_f32(w, x, y):
    _gemv(np.int64(_F32), w, x, y)  # np.int64: not a literal, so one compiled _gemv serves all


@nb.njit(nogil=True, cache=True)
def gemv_f16(w, x, y):
    _gemv(np.int64(_F16), w, x, y)


@nb.njit(nogil=True, cache=True)
def gemv_bf16(w, x, y):
    _gemv(np.int64(_BF16), w, x, y)


@nb.njit(nogil=True, cache=True)
def gemm_f32(w, x, y):
    _gemm(np.int64(_F32), w, x, y)


@nb.njit(nogil=True, cache=True)
def gemm_f16(w, x, y):
    _gemm(np.int64(_F16), w, x, y)


@nb.njit(nogil=True, cache=True)
def gemm_bf16(w, x, y):
    _gemm(np.int64(_BF16), w, x, y)


KERNELS = {
    T.F32: (gemv_f32, gemm_f32),
    T.F16: (gemv_f16, gemm_f16),
    T.BF16: (gemv_bf16, gemm_bf16),
}
