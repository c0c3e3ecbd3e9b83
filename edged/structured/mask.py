"""Allowed-token bitmasks for a batch, computed on a worker thread while the forward pass runs.

llguidance computes masks with the GIL released (and, through LLExecutor, over its own thread
pool), so submitting step t+1's masks before running step t+1's forward pass hides their cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import llguidance as llg
import numpy as np

from edged.backends.cpu.logit_mask import apply_token_bitmask
from edged.structured.matcher import GrammarMatcher


def allocate_bitmask(n_rows: int, vocab_size: int) -> np.ndarray:
    """[n_rows, ceil(V/32)] int32, every token allowed."""
    return np.full((n_rows, (vocab_size + 31) // 32), -1, dtype=np.int32)


@dataclass
class MaskBatch:
    """The masks of one step: bitmask rows are logits rows; only `rows` are constrained."""

    bitmask: np.ndarray  # [n_rows, W] int32
    rows: np.ndarray  # [k] int32, the constrained logits rows
    errors: dict[int, str] = field(default_factory=dict)  # row -> matcher error: fail that request

    def apply(self, logits: np.ndarray) -> None:
        """Disallowed tokens of the constrained rows -> -inf, in place (rows in `errors` too)."""
        if len(self.rows):
            apply_token_bitmask(logits, self.bitmask, self.rows)


class MaskComputer:
    """Fills a batch's bitmask in a background thread: `submit(...)` returns a Future[MaskBatch].

    The caller must not consume into, roll back or copy a submitted matcher until its future is
    done. One computer per engine; `close()` stops the worker thread.
    """

    def __init__(self, vocab_size: int, num_threads: int | None = None):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._executor = llg.LLExecutor(num_threads)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edged-mask")

    def compute(self, n_rows: int, matchers: Sequence[tuple[int, GrammarMatcher]]) -> MaskBatch:
        """Masks now, on the calling thread. matchers: (logits row, matcher) for constrained rows."""
        bitmask = allocate_bitmask(n_rows, self.vocab_size)
        rows = np.array([r for r, _ in matchers], dtype=np.int32)
        for r, m in matchers:
            if m.mask_words != self.words:
                raise ValueError(f"matcher of row {r} has {m.mask_words} mask words, computer {self.words}")
            if not 0 <= r < n_rows:
                raise ValueError(f"row {r} outside 0..{n_rows - 1}")
        if matchers:
            self._executor.unsafe_compute_mask_ptr([(m.llmatcher, r) for r, m in matchers],
                                                   bitmask.ctypes.data, self.words * 4, n_rows)
        errors = {r: m.error or "grammar matcher failed" for r, m in matchers if m.is_error()}
        return MaskBatch(bitmask, rows, errors)

    def submit(self, n_rows: int, matchers: Sequence[tuple[int, GrammarMatcher]]) -> "Future[MaskBatch]":
        """`compute` on the worker thread."""
        return self._pool.submit(self.compute, n_rows, list(matchers))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
