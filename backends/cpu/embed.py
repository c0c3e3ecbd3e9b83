"""Token embedding lookup: gather rows of a GGUF weight and dequantize only those."""

import numpy as np

from edged.quant.dequant import dequantize_rows
from edged.quant.tensor import QTensor


def embed(w: QTensor, ids) -> np.ndarray:
    """Rows `ids` (int [n], each in [0, n_rows)) of `w` as float32 [n, cols]; any supported type.

    An id out of range is a ValueError naming it; the table is never expanded whole.
    """
    ids = np.asarray(ids)  # [n]
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ValueError(f"token ids must be a 1-D integer array, got {ids.dtype} with shape {list(ids.shape)}")
    n_rows = w.n_rows
    bad = ids[(ids < 0) | (ids >= n_rows)]
    if bad.size:
        raise ValueError(f"token id {int(bad[0])} out of range for {w.name!r} with {n_rows} rows")
    raw = w.rows()[ids.astype(np.intp, copy=False)]  # [n, row_bytes]: gathered raw blocks
    return dequantize_rows(w.qtype, raw, w.n_cols)
