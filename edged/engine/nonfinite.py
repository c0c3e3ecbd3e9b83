"""The engine's non-finite guard: a sampled row whose logits hold NaN or inf (a broken model file or
metadata) fails its own request with a clear error; the other rows of the batch sample as usual."""

from __future__ import annotations

import numpy as np

from edged.backends.cpu.sampling import rows_scan


class NonFiniteLogits(Exception):
    """The result of a row whose logits are not finite; its message is the request's error."""

    def __init__(self, position: int):
        super().__init__(f"logits are not finite (NaN or inf) at position {position}; "
                         "the model file or its metadata is broken")
        self.position = position


def nonfinite_rows(logits: np.ndarray) -> list[int]:
    """Rows of the [n, vocab] logits holding a NaN or an inf: one pass over the float bits
    (backends/cpu/sampling.rows_scan), no [n, vocab] temporary."""
    _, finite = rows_scan(logits, argmax=False)
    return np.flatnonzero(~finite).tolist()
