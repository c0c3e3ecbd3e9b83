"""Token embedding lookup: gather rows of a GGUF weight and dequantize only those."""

import numpy as np

from edged.backends.cpu.legacy_groups import ungroup_rows
from edged.backends.cpu.matmul_legacy import KIND
from edged.quant.dequant import checked_indices, dequantize_rows
from edged.quant.tensor import QTensor


def embed(w: QTensor, ids) -> np.ndarray:
    """Rows `ids` (int [n], each in [0, n_rows)) of `w` as float32 [n, cols]; any supported type.

    An id out of range is a ValueError naming it; the table is never expanded whole.
    """
    ids = checked_indices(ids, w.n_rows, "token id", f" in {w.name!r}")  # [n]
    raw = w.rows()[ids]  # [n, row_bytes]: gathered raw blocks
    if w.grouped:  # a weight as the CPU's matmul reads it (a tied output projection)
        raw = ungroup_rows(raw, KIND[w.qtype])
    return dequantize_rows(w.qtype, raw, w.n_cols)
