"""empty_aligned: scratch arrays whose data starts on a 64-byte line, from Python and in kernels."""

import edged  # noqa: F401  (numba settings before numba is imported)
import numba as nb
import numpy as np
import pytest

from edged.backends.cpu.aligned import ALIGN, empty_aligned


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.float32])
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (5, 640), (2, 8192)])
def test_aligned_shape_dtype_and_writable(dtype, shape):
    # many allocations in a row: the allocator hands out addresses at every 16-byte offset
    arrays = [empty_aligned(shape[0], shape[1], dtype) for _ in range(32)]
    for a in arrays:
        assert a.ctypes.data % ALIGN == 0
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
    arrays[0][:] = 7
    assert int(arrays[0].sum()) == 7 * shape[0] * shape[1]


@nb.njit(cache=False)
def _fill_rows(n, k):
    out = np.empty(n, np.int64)
    for i in range(n):
        a = empty_aligned(i + 1, k, np.float32)
        a[:] = 1.0
        out[i] = a.shape[0] * a.shape[1] - int(a.sum())  # 0 when the whole buffer is usable
    return out


def test_inside_a_kernel():
    assert not _fill_rows(9, 33).any()
