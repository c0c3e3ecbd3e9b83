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
    # rows regrouped by the CPU backend for its kernels (backends/cpu/legacy_groups.py,
    # kquant_pairs.py), not GGUF's layout: only its matmul and embed read them
    grouped: bool = False

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

    def slab(self, e: int) -> "QTensor":
        """Expert e of a stacked 3-D tensor [n_expert, rows, cols] (GGUF's ffn_*_exps) as a 2-D
        QTensor [rows, cols]: a zero-copy view of its bytes, which matmul takes like any weight."""
        return self.slabs()[e]

    def slabs(self) -> tuple:
        """Every expert's slab (made once: each MoE step asks for several)."""
        views = self.__dict__.get("_slabs")
        if views is None:
            if len(self.shape) != 3:
                raise ValueError(f"tensor {self.name!r}: slabs need a 3-D [n_expert, rows, cols] tensor, "
                                 f"got shape {self.shape}")
            n, r, c = self.shape
            per = self.data.reshape(n, -1)  # uint8 [n_expert, rows * row_bytes]
            views = tuple(QTensor(f"{self.name}[{e}]", self.qtype, (r, c), per[e], self.grouped) for e in range(n))
            object.__setattr__(self, "_slabs", views)
        return views
