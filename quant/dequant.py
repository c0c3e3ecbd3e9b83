"""Dequantize any supported GGUF tensor type to float32 through one dispatch table."""

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.quant.float import dequantize_bf16, dequantize_f16, dequantize_f32
from edged.quant.iq1 import dequantize_iq1_m, dequantize_iq1_s
from edged.quant.iq2 import dequantize_iq2_s, dequantize_iq2_xs, dequantize_iq2_xxs
from edged.quant.iq3 import dequantize_iq3_s, dequantize_iq3_xxs
from edged.quant.iquants import dequantize_iq4_nl, dequantize_iq4_xs
from edged.quant.kquants import dequantize_q2_k, dequantize_q3_k, dequantize_q4_k, dequantize_q5_k, dequantize_q6_k
from edged.quant.q4_q5 import dequantize_q4_0, dequantize_q4_1, dequantize_q5_0, dequantize_q5_1
from edged.quant.mxfp4 import dequantize_mxfp4
from edged.quant.q8 import dequantize_q8_0
from edged.quant.tensor import QTensor
from edged.quant.ternary import dequantize_tq1_0, dequantize_tq2_0
from edged.quant.types import SUPPORTED_TYPES, row_bytes, traits

# qtype -> Numba kernel (raw uint8 [n_rows, row_bytes] read-only C-contiguous,
#                        out float32 [n_rows, n_cols] C-contiguous)
DEQUANTIZERS = {
    T.F32: dequantize_f32,
    T.F16: dequantize_f16,
    T.BF16: dequantize_bf16,
    T.Q4_0: dequantize_q4_0,
    T.Q4_1: dequantize_q4_1,
    T.Q5_0: dequantize_q5_0,
    T.Q5_1: dequantize_q5_1,
    T.Q8_0: dequantize_q8_0,
    T.Q2_K: dequantize_q2_k,
    T.Q3_K: dequantize_q3_k,
    T.Q4_K: dequantize_q4_k,
    T.Q5_K: dequantize_q5_k,
    T.Q6_K: dequantize_q6_k,
    T.IQ4_NL: dequantize_iq4_nl,
    T.IQ4_XS: dequantize_iq4_xs,
    T.IQ2_XXS: dequantize_iq2_xxs,
    T.IQ2_XS: dequantize_iq2_xs,
    T.IQ2_S: dequantize_iq2_s,
    T.IQ3_XXS: dequantize_iq3_xxs,
    T.IQ3_S: dequantize_iq3_s,
    T.IQ1_S: dequantize_iq1_s,
    T.IQ1_M: dequantize_iq1_m,
    T.TQ1_0: dequantize_tq1_0,
    T.TQ2_0: dequantize_tq2_0,
    T.MXFP4: dequantize_mxfp4,
}
assert set(DEQUANTIZERS) == set(SUPPORTED_TYPES), "every supported type needs a dequantizer"


def dequantize_rows(qtype, raw: np.ndarray, n_cols: int) -> np.ndarray:
    """Dequantize raw blocks uint8 [n_rows, row_bytes] of `qtype` -> float32 [n_rows, n_cols]."""
    tt = traits(qtype)  # ValueError naming an unsupported type
    rb = row_bytes(tt.qtype, n_cols)
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != rb:
        raise ValueError(
            f"{tt.qtype.name} rows of {n_cols} need uint8 [n_rows, {rb}], got {raw.dtype} {list(raw.shape)}"
        )
    raw = np.ascontiguousarray(raw)
    if raw.flags.writeable:
        # one kernel specialization: always hand Numba a read-only view (mmap'd weights are read-only)
        raw = raw.view()
        raw.flags.writeable = False
    out = np.empty((raw.shape[0], n_cols), dtype=np.float32)  # [n_rows, n_cols]
    if raw.shape[0]:
        DEQUANTIZERS[tt.qtype](raw, out)
    return out


def checked_indices(idx, n: int, what: str = "row index", where: str = "", plural: str = "") -> np.ndarray:
    """idx as a 1-D intp array of row indices; ValueError naming the first one outside [0, n)
    (`what`/`plural` name an index and several in messages, e.g. "token id"; `where` adds context)."""
    idx = np.asarray(idx)
    if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
        raise ValueError(f"{plural or what + 's'} must be a 1-D integer array, got {idx.dtype} with shape "
                         f"{list(idx.shape)}")
    bad = idx[(idx < 0) | (idx >= n)]
    if bad.size:
        raise ValueError(f"{what} {int(bad[0])} out of range [0, {n}){where}")
    return idx.astype(np.intp, copy=False)


def dequantize(qt: QTensor, rows: slice | np.ndarray | None = None) -> np.ndarray:
    """Dequantize `qt` to float32.

    rows=None: the whole tensor, shaped like `qt.shape` (a 2-D weight gives [rows, cols]).
    rows=slice or 1-D integer array (indices in [0, n_rows), no negatives): those rows,
    float32 [n_selected, cols]. An out-of-range index or an unsupported type is a ValueError.
    """
    if qt.grouped:
        raise ValueError(f"tensor {qt.name!r}: its rows are in the CPU backend's grouped layout; "
                         "dequantize the tensor as loaded")
    raw = qt.rows()  # [n_rows, row_bytes]
    if rows is None:
        return dequantize_rows(qt.qtype, raw, qt.n_cols).reshape(qt.shape)
    if isinstance(rows, slice):
        raw = raw[rows]
    else:
        raw = raw[checked_indices(rows, qt.n_rows, plural="rows")]
    return dequantize_rows(qt.qtype, raw, qt.n_cols)
