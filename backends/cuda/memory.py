"""Host <-> device transfers, weight upload and device memory queries.

Weights go to the device as their GGUF blocks, never expanded: a DeviceMatrix holds the raw rows
uint8 [m, row_bytes] and the kernels decode blocks as they read them.
"""

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda

from edged.quant.tensor import QTensor
from edged.quant.types import traits


@dataclass
class DeviceMatrix:
    """A GGUF weight on the device: shape (m, k) in numpy order, rows uint8 [m, row_bytes]."""

    name: str
    qtype: object  # gguf.GGMLQuantizationType
    shape: tuple
    rows: object  # device uint8 [m, row_bytes]

    @property
    def nbytes(self) -> int:
        return int(self.rows.shape[0]) * int(self.rows.shape[1])


def is_device(a) -> bool:
    """True for a numba.cuda device array (real or simulated; the simulator lacks is_cuda_array)."""
    return hasattr(a, "copy_to_host") and not isinstance(a, np.ndarray)


def upload(a: np.ndarray):
    """A device copy of host array `a` (one H2D copy of a C-contiguous version); a device array
    is returned as is (activations already on this backend)."""
    if is_device(a):
        return a
    return cuda.to_device(np.ascontiguousarray(a))


def to_host(d) -> np.ndarray:
    """A host numpy copy of device array d (numpy input is returned as is)."""
    if isinstance(d, np.ndarray):
        return d
    return d.copy_to_host()


def as_device(a, dtype, name: str):
    """`a` as a device array of `dtype`: device arrays must already have that dtype (no silent
    device-side conversion); host arrays are converted and uploaded."""
    if is_device(a):
        if a.dtype != np.dtype(dtype):
            raise ValueError(f"{name}: device array has dtype {a.dtype}, expected {np.dtype(dtype)}")
        if not a.is_c_contiguous():
            raise ValueError(f"{name}: device array must be C-contiguous")
        return a
    return cuda.to_device(np.ascontiguousarray(a, dtype=dtype))


def upload_matrix(w: QTensor) -> DeviceMatrix:
    """Upload a 2-D GGUF weight's raw blocks: DeviceMatrix(name, qtype, (m, k), rows uint8 [m, row_bytes])."""
    if not isinstance(w, QTensor):
        raise TypeError(f"upload_matrix needs a QTensor, got {type(w).__name__}")
    if len(w.shape) != 2:
        raise ValueError(f"upload_matrix: {w.name!r} must be 2-D, got shape {w.shape}")
    tt = traits(w.qtype)  # ValueError names an unknown type
    rows = np.ascontiguousarray(w.rows())  # [m, row_bytes]
    return DeviceMatrix(name=w.name, qtype=tt.qtype, shape=(int(w.shape[0]), int(w.shape[1])), rows=cuda.to_device(rows))


def device_memory() -> tuple:
    """(free_bytes, total_bytes) of the current device; under the simulator, which has no limit,
    both are 2**62."""
    free, total = cuda.current_context().get_memory_info()
    if not (math.isfinite(free) and math.isfinite(total)):
        return (1 << 62, 1 << 62)
    return int(free), int(total)
