"""The K-quants' and IQ4_XS's row-pair layout: the CPU backend's copy of a 2-D weight in which rows
2p and 2p + 1 alternate superblock by superblock.

The gemv (kquant_gemv.rows_dot) reads two rows together, one superblock of each per step. From
GGUF's layout those are two streams a row apart, and this CPU's hardware prefetchers lose them
when the weights come from DRAM (Q4_K 8192 x 4096 at n = 1: 14 GB/s, 28 with software prefetch);
paired, the same reads are one ascending stream (35 GB/s; docs/kernels.md). Every superblock keeps
its bytes, so the bits are the raw rows'. Only tensors with an even number of rows are paired
(matrices, and the experts' stacked matrices of a mixture of experts).

    raw     row 2p: [sb 0][sb 1]...   row 2p + 1: [sb 0][sb 1]...
    paired  pair p: [2p sb 0][2p+1 sb 0][2p sb 1][2p+1 sb 1]...
"""

from dataclasses import replace

import numpy as np

from edged.quant.tensor import QTensor
from edged.quant.types import traits


def pairs_rows(w: QTensor) -> bool:
    """Whether w can take the pair layout: a matrix, or a stack of experts' matrices [n_expert,
    rows, cols], with an even number of rows (so no pair spans two experts)."""
    return len(w.shape) in (2, 3) and w.shape[-2] % 2 == 0


def pair_rows(rows: np.ndarray, block_bytes: int) -> np.ndarray:
    """uint8 [m, row_bytes] raw rows (m even) -> the same bytes in the pair layout (a copy)."""
    m, rb = rows.shape
    nsb = rb // block_bytes
    return np.ascontiguousarray(rows.reshape(m // 2, 2, nsb, block_bytes).swapaxes(1, 2)).reshape(m, rb)


def unpaired_rows(rows: np.ndarray, block_bytes: int, ids: np.ndarray) -> np.ndarray:
    """Raw rows `ids` (int [n]) of a tensor in the pair layout (uint8 [m, row_bytes]) -> [n, row_bytes]."""
    m, rb = rows.shape
    nsb = rb // block_bytes
    by_pair = rows.reshape(m // 2, nsb, 2, block_bytes)  # [pair, superblock, row of the pair, bytes]
    return by_pair[ids // 2, :, ids % 2].reshape(len(ids), rb)


def paired(w: QTensor) -> QTensor:
    """w (pairs_rows) as a pair-layout copy, marked grouped (the CPU's own layout)."""
    return replace(w, data=pair_rows(w.rows(), traits(w.qtype).type_size).reshape(-1), grouped=True)
