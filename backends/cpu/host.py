"""Placement and layout ops of the CPU backend: where data lives and how rows/columns are cut.

The CPU backend works on host numpy arrays, so moving data in is a no-op; the CUDA backend
implements the same functions with device copies (backends/cuda/ops.py). The decoder calls them at
a layer boundary between backends and to cut activations without touching their memory directly.
"""

import numpy as np

from edged.backends.base import Batch
from edged.backends.cpu.host_memory import copy_fits
from edged.backends.cpu.matmul import for_matmul
from edged.quant.tensor import QTensor


def upload(a: np.ndarray) -> np.ndarray:
    """A host array (or anything array-like from another backend, already on the host)."""
    return np.ascontiguousarray(a)


def to_host(a) -> np.ndarray:
    """This backend's array as a host numpy array (the array itself on the CPU)."""
    return a


def upload_matrix(w: QTensor) -> QTensor:
    """A weight as this backend's matmul reads it fastest: a matrix of the 32-element block types
    as a copy with grouped rows (legacy_groups.py), a K-quant matrix or experts' stack as a copy
    in row pairs (kquant_pairs.py), everything else the mmap'd QTensor itself; the mapping too
    where the copy would not leave RAM free (host_memory.copy_fits)."""
    return for_matmul(w, fits=copy_fits)


def prepare_batch(batch: Batch) -> Batch:
    """The step's metadata as this backend's kernels read it (host arrays: the batch itself)."""
    return batch


def take_rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """x[rows] as a new C-contiguous array; x [n, ...], rows int32 [r]."""
    return np.ascontiguousarray(x[rows])


def slice_cols(x: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Columns start:stop of x [n, c]: a view [n, stop - start] (no copy; the gated activations
    read it in place, other ops copy what they need contiguous)."""
    return x[:, start:stop]
