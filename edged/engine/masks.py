"""A step's grammar masks: submitted before the forward pass, computed on a worker thread while
it runs (llguidance drops the GIL), applied to the constrained rows' logits before sampling.

Only constrained rows are touched, so an unconstrained request samples exactly what it samples
alone whatever shares its batch.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from edged.structured import MaskBatch, MaskComputer

MASK_TIMINGS_KEPT = 8192


class StepMasks:
    """The engine's mask side; the MaskComputer (llguidance's executor) and the worker thread are
    made on the first constrained step. `timings` keeps (seconds, rows) of recent computations."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self._computer: MaskComputer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.timings: collections.deque = collections.deque(maxlen=MASK_TIMINGS_KEPT)

    def _timed(self, n_rows: int, matchers: list) -> MaskBatch:
        t0 = time.perf_counter()
        batch = self._computer.compute(n_rows, matchers)
        self.timings.append((time.perf_counter() - t0, len(matchers)))
        return batch

    def submit(self, lives: list):
        """Start the masks of the rows whose constraint applies now; None when there are none."""
        rows = [(r, lv.constraint) for r, lv in enumerate(lives)
                if lv.constraint is not None and lv.constraint.masking]
        if not rows:
            return None
        if self._computer is None:
            self._computer = MaskComputer(self.vocab_size)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edged-mask")
        fut: Future = self._pool.submit(self._timed, len(lives), [(r, c.matcher) for r, c in rows])
        return fut, rows

    @staticmethod
    def collect(pending):
        """Wait for the masks: (MaskBatch or the exception computing them, rows) or None."""
        if pending is None:
            return None
        fut, rows = pending
        try:
            return fut.result(), rows
        except Exception as e:  # a mask that cannot be computed fails its rows, not the step
            return e, rows

    @staticmethod
    def apply(masked, logits: np.ndarray) -> tuple[np.ndarray, dict[int, str]]:
        """Logits with the masks applied (float32, C-contiguous) and {row: error} for rows whose
        matcher failed."""
        if masked is None:
            return logits, {}
        batch, rows = masked
        if isinstance(batch, Exception):
            return logits, {r: f"grammar mask failed: {batch}" for r, _ in rows}
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        words = batch.bitmask.view(np.uint32)
        for r, c in rows:
            t = c.extra_token
            if t is not None and 0 <= t < words.shape[1] * 32:
                words[r, t >> 5] |= np.uint32(1 << (t & 31))
        batch.apply(logits)
        return logits, dict(batch.errors)

    def close(self) -> None:
        if self._computer is not None:
            self._pool.shutdown(wait=True)
            self._computer.close()
