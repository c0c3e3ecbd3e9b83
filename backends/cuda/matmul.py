"""CUDA matmul: one dispatch table from GGUF type to a (mat-vec, tiled) kernel pair.

    matmul(w: DeviceMatrix, x [n, k], *, qx=None) -> y [n, m]     y = x @ W.T on the device
    check_supported(qtype) -> None                                 ValueError naming an unsupported type
    supported_types() -> tuple

Block types quantize x on the device exactly as the CPU backend does (act_quant.py); pass
qx = quantize_activations(x) to share one quantization between matmuls of the same x.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda

from edged.backends.cuda.act_quant import quantize_activations
from edged.backends.cuda.dequant import DECODERS
from edged.backends.cuda.launch import blocks_for
from edged.backends.cuda.matmul_float import bf16_value, f16_value, f32_value, make_float_kernels
from edged.backends.cuda.matmul_int import make_int_kernels
from edged.backends.cuda.matmul_layout import MV_MAX_N, MV_THREADS, MV_WARPS, TILE_ROWS, TILE_THREADS, TILE_TOKENS
from edged.backends.cuda.memory import DeviceMatrix, as_device
from edged.backends.cuda.types import FLOAT_TYPES, INT_TYPES, check_supported, supported_types  # noqa: F401 (re-exported)
from edged.quant.types import traits

# float types: (element decoder, dtype of the rows' typed view)
_FLOAT = {T.F32: (f32_value, np.float32), T.F16: (f16_value, np.uint16), T.BF16: (bf16_value, np.uint16)}
if set(_FLOAT) != set(FLOAT_TYPES) or set(DECODERS) != set(INT_TYPES):
    raise ImportError("backends/cuda/types.py lists other types than the kernels have")
_KERNELS: dict = {}  # qtype -> (matvec, tiled), built on first use (each compiles on its first launch)


def kernels_for(qtype):
    """(matvec, tiled) CUDA kernels of a supported type."""
    check_supported(qtype)
    qtype = traits(qtype).qtype
    if qtype not in _KERNELS:
        if qtype in _FLOAT:
            _KERNELS[qtype] = make_float_kernels(_FLOAT[qtype][0])
        else:
            _KERNELS[qtype] = make_int_kernels(*DECODERS[qtype])
    return _KERNELS[qtype]


def matmul(w: DeviceMatrix, x, *, qx=None):
    """y float32 [n, m] = x @ W.T for a device GGUF weight w [m, k] and float32 activations x [n, k]
    (a device array, or host numpy which is uploaded)."""
    if not isinstance(w, DeviceMatrix):
        raise TypeError(f"matmul weight must be a DeviceMatrix (upload_matrix), got {type(w).__name__}")
    matvec, tiled = kernels_for(w.qtype)
    m, k = w.shape
    x = as_device(x, np.float32, "matmul x")
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"matmul {w.name!r} [{m}, {k}] needs x of shape [n, {k}], got {tuple(x.shape)}")
    n = int(x.shape[0])
    y = cuda.device_array((n, m), dtype=np.float32)  # [n, m]
    if n == 0:
        return y
    if n <= MV_MAX_N:
        config = (blocks_for(m, MV_WARPS), MV_THREADS)
    else:
        config = ((blocks_for(m, TILE_ROWS), blocks_for(n, TILE_TOKENS)), TILE_THREADS)
    kern = matvec if n <= MV_MAX_N else tiled
    if w.qtype in _FLOAT:
        kern[config](w.rows.view(_FLOAT[w.qtype][1]), x, y)
    else:
        if qx is None:
            qx = quantize_activations(x)
        xq, xd, xs = qx
        if tuple(xq.shape) != (n, k) or tuple(xd.shape) != (n, k // 32) or tuple(xs.shape) != (n, k // 32):
            raise ValueError(f"qx shapes {xq.shape}, {xd.shape}, {xs.shape} do not match x {tuple(x.shape)}")
        kern[config](w.rows, xq, xd, xs, y)
    return y
