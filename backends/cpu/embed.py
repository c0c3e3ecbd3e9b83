"""Token embedding lookup: gather rows of a GGUF weight and dequantize only those."""

import numpy as np

from edged.backends.cpu.kquant_pairs import unpaired_rows
from edged.backends.cpu.legacy_groups import ungroup_rows
from edged.backends.cpu.matmul_legacy import KIND
from edged.quant.dequant import checked_indices, dequantize_rows
from edged.quant.tensor import QTensor
from edged.quant.types import traits


def embed(w: QTensor, ids) -> np.ndarray:
    """Rows `ids` (int [n], each in [0, n_rows)) of `w` as float32 [n, cols]; any supported type.

    An id out of range is a ValueError naming it; the table is never expanded whole.
    """
    ids = checked_indices(ids, w.n_rows, "token id", f" in {w.name!r}")  # [n]
    if not w.grouped:
        raw = w.rows()[ids]  # [n, row_bytes]: gathered raw blocks
    elif w.qtype in KIND:  # a weight as the CPU's matmul reads it (a tied output projection)
        raw = ungroup_rows(w.rows()[ids], KIND[w.qtype])
    else:  # the K-quants' row pairs
        raw = unpaired_rows(w.rows(), w.qtype, ids)
    return dequantize_rows(w.qtype, raw, w.n_cols)
