"""QTensor: a quantized tensor as raw GGUF blocks, never expanded."""

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from edged.quant.types import row_bytes


@dataclass(frozen=True)
class QTensor:
    """Raw GGUF tensor: `shape` in numpy order (rows, cols) — GGUF lists dims fastest-first — and
    `data`, a zero-copy uint8 view of the file's mmap (or any uint8 buffer) of exactly the bytes."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 [n_bytes]

    @property
    def n_rows(self) -> int:
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n

    @property
    def n_cols(self) -> int:
        return self.shape[-1]

    def rows(self) -> np.ndarray:
        """The bytes as a 2-D uint8 view [n_rows, bytes_per_row] (made once: every matmul asks)."""
        view = self.__dict__.get("_rows")
        if view is None:
            view = self.data.reshape(self.n_rows, row_bytes(self.qtype, self.n_cols))
            object.__setattr__(self, "_rows", view)  # a cache, not a field: eq and repr ignore it
        return view
