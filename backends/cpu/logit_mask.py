"""Apply packed allowed-token bitmasks to logits in place: disallowed tokens -> -inf.

Bitmask layout is llguidance's: row r, token t allowed iff bit (t % 32) of int32 word t // 32 is
set. Only the listed rows are touched (unconstrained rows of a batch keep their logits exactly).
A word of all ones (most words inside a JSON string) is skipped; others go through a branchless
32-lane select LLVM vectorizes.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_NEG_INF = np.float32(-np.inf)


@nb.njit(cache=True, nogil=True)
def _apply_rows(logits, bitmask, rows):
    n_vocab = logits.shape[1]
    n_words = bitmask.shape[1]
    full = min(n_vocab // 32, n_words)
    for k in range(rows.shape[0]):
        r = rows[k]
        row = logits[r]
        bits = bitmask[r]
        for w in range(full):
            word = bits[w]
            if word == -1:
                continue
            base = w * 32
            # plain indexing of the row (no per-word slice views): LLVM vectorizes this select
            for b in range(32):
                row[base + b] = row[base + b] if (word >> b) & 1 else _NEG_INF
        for t in range(full * 32, n_vocab):  # partial last word, and logits beyond the mask
            w = t >> 5
            if w >= n_words or not (bits[w] >> (t & 31)) & 1:
                row[t] = _NEG_INF


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray, rows=None) -> None:
    """logits [n, V] float32 (C-contiguous), bitmask [n, W] int32; rows: which rows (default all).

    Tokens past the mask's 32*W bits are disallowed (a model's padded logits).
    """
    if logits.dtype != np.float32 or logits.ndim != 2 or not logits.flags["C_CONTIGUOUS"]:
        raise ValueError(f"logits must be C-contiguous float32 [n, V], not {logits.dtype} {logits.shape}")
    if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask must be int32 [{logits.shape[0]}, W], not {bitmask.dtype} {bitmask.shape}")
    rows = np.arange(logits.shape[0], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows.ndim != 1 or (rows.size and (rows.min() < 0 or rows.max() >= logits.shape[0])):
        raise ValueError(f"rows must index 0..{logits.shape[0] - 1}")
    _apply_rows(logits, np.ascontiguousarray(bitmask), rows)


def apply_token_bitmask_reference(logits: np.ndarray, bitmask: np.ndarray, rows) -> None:
    """numpy reference (tests): unpack bits little-endian per word and mask."""
    n_vocab = logits.shape[1]
    for r in rows:
        bits = np.unpackbits(bitmask[r].view(np.uint8), bitorder="little").astype(bool)
        allowed = np.zeros(n_vocab, dtype=bool)
        k = min(n_vocab, bits.size)
        allowed[:k] = bits[:k]
        logits[r, ~allowed] = -np.inf
