"""Perplexity by llama.cpp's method (llama-perplexity): non-overlapping chunks of `ctx` tokens,
each evaluated from scratch with its first token replaced by BOS, scoring only the second half."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from edged.backends.base import Batch


@dataclass
class ChunkResult:
    chunk: int  # 0-based
    n_chunks: int
    ppl: float  # running estimate over all chunks so far
    nll_sum: float
    n_scored: int


def _log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log p(target) per row of logits [n, V], in float64 for the reduction."""
    m = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - m, dtype=np.float64).sum(axis=1)) + m[:, 0]
    return logits[np.arange(len(targets)), targets] - lse


def perplexity(model, tokens: list[int], bos_id: int, ctx: int = 512,
               block_size: int = 16) -> Iterator[ChunkResult]:
    """Yield the running perplexity after each chunk; `tokens` is the text tokenized with BOS."""
    if ctx < 4:
        raise ValueError("ctx must be at least 4")
    n_chunks = len(tokens) // ctx
    if n_chunks == 0:
        raise ValueError(f"the text has {len(tokens)} tokens; need at least ctx = {ctx}")
    n_blocks = -(-ctx // block_size)
    kv = model.allocate_kv(n_blocks, block_size)
    first = ctx // 2
    nll_sum, n_scored = 0.0, 0
    for c in range(n_chunks):
        chunk = np.asarray(tokens[c * ctx : (c + 1) * ctx], dtype=np.int32)  # [ctx]
        chunk[0] = bos_id
        batch = Batch.single(chunk, 0, n_blocks, block_size,
                             logits_indices=np.arange(first, ctx - 1, dtype=np.int32))
        logits = model.forward(batch, kv)  # [ctx - 1 - first, V]: positions first..ctx-2
        lp = _log_softmax_at(logits, chunk[first + 1 : ctx])
        nll_sum -= float(lp.sum())
        n_scored += lp.shape[0]
        yield ChunkResult(c, n_chunks, math.exp(nll_sum / n_scored), nll_sum, n_scored)
