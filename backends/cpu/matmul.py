"""CPU quantized matmul: one dispatch table from GGUF type to Numba kernels.

Public API
    matmul(w: QTensor, x float32 [n, k], *, qx=None, out=None) -> y float32 [n, m]
        y = x @ W.T where W is w dequantized [m, k]; any n >= 1 (decode n=1, prefill/batches 512+).
        For types whose traits().act_format == "q8_32", x is quantized ONCE per call with
        backends/cpu/act_quant.quantize_activations (or pass qx = quantize_activations(x) to share
        it between several matmuls of the same x, e.g. the q/k/v projections).
    check_supported(qtype) -> None        raises ValueError naming the type if no kernel exists
    supported_types() -> tuple            types with kernels, in TYPE_TRAITS order
    kernels_for(qtype) -> (gemv, gemm)     the two Numba kernels of a type (for inspect_asm, benches)
    gemv_max_n(qtype) -> int               the largest n that matmul hands to the type's gemv

Kernel-module contract
    Each kernel module (matmul_float.py, matmul_legacy.py, matmul_kquants.py) exports
    `KERNELS: dict[GGMLQuantizationType, tuple[gemv, gemm]]`, both with the same signature:
      act_format "q8_32":  f(w_rows uint8 [m, row_bytes], xq int8 [n, k], xd float32 [n, k/32],
                             xs int32 [n, k/32], y float32 [n, m]) -> None   (writes every y[t, r])
      act_format "f32":    f(w_rows uint8 [m, row_bytes], x float32 [n, k], y float32 [n, m]) -> None
    All arrays are C-contiguous. gemv is called for n <= the module's GEMV_MAX_N (this module's
    GEMV_MAX_N where it has none), gemm (weight blocks read once per tile of tokens) for larger n;
    both accept any n. Kernels may assume valid shapes: this module checks.
"""

import numpy as np

from edged.backends.cpu.act_quant import quantize_activations
from edged.quant.tensor import QTensor
from edged.quant.types import TYPE_TRAITS, traits

from edged.backends.cpu import matmul_float, matmul_kquants, matmul_legacy
from edged.backends.cpu import matmul_iqgrid
from edged.backends.cpu import matmul_lowbit

# n at or below which gemv is used unless the kernel module sets its own: gemv reads each row once
# for all n tokens but costs a full block dot per token, while gemm pays a 16-token tile whatever
# n is; the measured crossover is n = 4 (the legacy types' gemv stays ahead up to 24).
GEMV_MAX_N = 4


def _merge_tables():
    """qtype -> (gemv, gemm), and qtype -> the module's gemv threshold."""
    table, max_n = {}, {}
    for mod in (matmul_float, matmul_legacy, matmul_kquants, matmul_iqgrid, matmul_lowbit):
        for qtype, pair in mod.KERNELS.items():
            if qtype in table:
                raise RuntimeError(f"two kernel modules claim {qtype.name}")
            table[qtype] = pair
            max_n[qtype] = getattr(mod, "GEMV_MAX_N", GEMV_MAX_N)
    return table, max_n


_KERNELS, _GEMV_MAX_N = _merge_tables()


def supported_types() -> tuple:
    """Types that have a matmul kernel, in TYPE_TRAITS order."""
    return tuple(t for t in TYPE_TRAITS if t in _KERNELS)


def check_supported(qtype) -> None:
    """Raise ValueError (naming the type) unless matmul has a kernel for `qtype`; call at load time."""
    tt = traits(qtype)  # ValueError for types edged does not know at all
    if tt.qtype not in _KERNELS:
        names = ", ".join(t.name for t in supported_types())
        raise ValueError(f"no CPU matmul kernel for tensor type {tt.qtype.name}; supported: {names}")


def kernels_for(qtype):
    """(gemv, gemm) Numba dispatchers for `qtype` (ValueError if unsupported)."""
    check_supported(qtype)
    return _KERNELS[traits(qtype).qtype]


def gemv_max_n(qtype) -> int:
    """The largest batch that matmul runs through `qtype`'s gemv (ValueError if unsupported)."""
    check_supported(qtype)
    return _GEMV_MAX_N[traits(qtype).qtype]


# qtype -> (gemv, gemm, takes q8_32 activations, gemv's largest n): one dict lookup per call
# instead of enum conversions and trait lookups (Python time a small decode matmul notices)
_DISPATCH = {
    qtype: (*pair, traits(qtype).act_format == "q8_32", _GEMV_MAX_N[qtype]) for qtype, pair in _KERNELS.items()
}


def matmul(w: QTensor, x: np.ndarray, *, qx=None, out: np.ndarray | None = None) -> np.ndarray:
    """y float32 [n, m] = x @ W.T for a GGUF weight w [m, k] and float32 activations x [n, k].

    qx: optional (xq, xd, xs) = quantize_activations(x), reused instead of quantizing again.
    out: optional float32 C-contiguous [n, m] buffer to write into (returned).
    """
    if not isinstance(w, QTensor):
        raise TypeError(f"matmul weight must be a QTensor, got {type(w).__name__}")
    if len(w.shape) != 2:
        raise ValueError(f"matmul weight {w.name!r} must be 2-D, got shape {w.shape}")
    plan = _DISPATCH.get(w.qtype)
    if plan is None:
        check_supported(w.qtype)  # raises, naming the type
    gemv, gemm, q8, max_n = plan
    m, k = w.shape
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"matmul activations must be float32, got {x.dtype}")
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"matmul {w.name!r} [{m}, {k}] needs x of shape [n, {k}], got {x.shape}")
    n = x.shape[0]
    if out is None:
        out = np.empty((n, m), dtype=np.float32)  # [n, m]
    elif out.shape != (n, m) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 [{n}, {m}], got {out.dtype} {out.shape}")
    if n == 0:
        return out
    rows = w.rows()  # uint8 [m, row_bytes]
    kern = gemv if n <= max_n else gemm
    if q8:
        if qx is None:
            qx = quantize_activations(x)
        xq, xd, xs = qx
        if xq.shape != (n, k) or xd.shape != (n, k // 32) or xs.shape != (n, k // 32):
            raise ValueError(f"qx shapes {xq.shape}, {xd.shape}, {xs.shape} do not match x {x.shape}")
        kern(rows, xq, xd, xs, out)
    else:
        kern(rows, x if x.flags.c_contiguous else np.ascontiguousarray(x), out)
    return out
