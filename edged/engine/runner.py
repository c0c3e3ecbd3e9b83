"""Turns a scheduled step into one flat Batch for the model's forward pass."""

from __future__ import annotations

import numpy as np

from edged.backends.base import Batch
from edged.engine.scheduler import ScheduledStep
from edged.kv.manager import KVCacheManager


def build_batch(step: ScheduledStep, kv: KVCacheManager) -> tuple[Batch, list[int]]:
    """Flatten the step's tokens; returns the batch and, per logits row, the index of the item
    (request) that samples from it — only items whose step reaches their last known token."""
    bs = kv.block_size
    n_tokens = step.num_tokens
    n_seqs = len(step.items)
    token_ids = np.empty(n_tokens, dtype=np.int32)  # [n_tokens]
    positions = np.empty(n_tokens, dtype=np.int32)  # [n_tokens]
    slot_mapping = np.empty(n_tokens, dtype=np.int32)  # [n_tokens]
    seq_starts = np.zeros(n_seqs + 1, dtype=np.int32)  # [n_seqs + 1]
    seq_lens = np.empty(n_seqs, dtype=np.int32)  # [n_seqs]
    max_blocks = max((len(kv.table(r.request_id)) for r, _ in step.items), default=1)
    block_tables = np.full((n_seqs, max(max_blocks, 1)), -1, dtype=np.int32)  # [n_seqs, max_blocks]
    windowed = kv.window_pool is not None
    if windowed:  # the sliding-window layers' group: same width, -1 before each window
        window_tables = np.full_like(block_tables, -1)  # [n_seqs, max_blocks]
        window_slots = np.empty(n_tokens, dtype=np.int32)  # [n_tokens]
    logits_rows: list[int] = []
    samplers: list[int] = []
    t = 0
    for s, (req, n) in enumerate(step.items):
        start = req.num_computed_tokens
        table = kv.table(req.request_id)
        block_tables[s, : len(table)] = table
        pos = np.arange(start, start + n, dtype=np.int32)
        token_ids[t : t + n] = req.token_ids[start : start + n]
        positions[t : t + n] = pos
        slot_mapping[t : t + n] = block_tables[s, pos // bs] * bs + pos % bs
        if windowed:
            wtable = kv.window_table(req.request_id)
            window_tables[s, : len(wtable)] = wtable
            window_slots[t : t + n] = window_tables[s, pos // bs] * bs + pos % bs
        seq_lens[s] = start + n
        t += n
        seq_starts[s + 1] = t
        if start + n == req.num_tokens:
            logits_rows.append(t - 1)
            samplers.append(s)
    batch = Batch(token_ids=token_ids, positions=positions, seq_starts=seq_starts, seq_lens=seq_lens,
                  block_tables=block_tables, slot_mapping=slot_mapping,
                  logits_indices=np.asarray(logits_rows, dtype=np.int32), block_size=bs,
                  window_block_tables=window_tables if windowed else None,
                  window_slot_mapping=window_slots if windowed else None)
    return batch, samplers
