"""Turns a scheduled step into one flat Batch for the model's forward pass, and says which rows
of its output belong to whom (sampled, prompt-scored, pooled)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edged.backends.base import Batch
from edged.engine.scheduler import ScheduledStep
from edged.kv.manager import KVCacheManager


@dataclass
class StepRows:
    """Where each item's outputs are. Logits rows: the sampled ones first (row r samples item
    samplers[r]), then the draft tokens' ones, then the prompt-scored ones; hidden rows
    (final-normed states) are pooled."""

    samplers: list[int] = field(default_factory=list)  # item index per sampled logits row
    # sampled row -> (first logits row, count) of its draft tokens' rows (they follow the sampled
    # rows, in order; edged.engine.spec_ngram): row j predicts the token after draft j
    drafts: dict[int, tuple[int, int]] = field(default_factory=dict)
    # (item, first logits row, row count, first position): row j scores prompt token position + j + 1
    scored: list[tuple[int, int, int, int]] = field(default_factory=list)
    # (item, first hidden row, row count, first position) of embedding requests
    pooled: list[tuple[int, int, int, int]] = field(default_factory=list)
    hidden_rows: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))  # int32 [h]


def _pooled_positions(req, start: int, end: int) -> tuple[int, int]:
    """Positions [a, b) of this chunk whose hidden states the request's pooling reads."""
    if req.pooling == "mean":
        return start, end
    if req.pooling == "cls":
        return (0, 1) if start == 0 else (start, start)
    last = req.num_prompt_tokens - 1  # "last"
    return (last, last + 1) if start <= last < end else (start, start)


def build_batch(step: ScheduledStep, kv: KVCacheManager) -> tuple[Batch, StepRows]:
    """Flatten the step's tokens; returns the batch and its StepRows. An item samples when its
    step reaches its last known token and it has output left to make (max_tokens 0 never does)."""
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
    rows = StepRows()
    sample_rows: list[int] = []
    score_rows: list[int] = []
    draft_rows: list[int] = []
    hidden_rows: list[int] = []
    t = 0
    for s, (req, n) in enumerate(step.items):
        start = req.num_computed_tokens
        end = start + n
        table = kv.table(req.request_id)
        block_tables[s, : len(table)] = table
        pos = np.arange(start, end, dtype=np.int32)
        nd = len(req.spec_tokens)  # drafts after the known tokens (verified by their logits rows)
        token_ids[t : t + n - nd] = req.token_ids[start : end - nd]
        if nd:
            token_ids[t + n - nd : t + n] = req.spec_tokens
        positions[t : t + n] = pos
        slot_mapping[t : t + n] = block_tables[s, pos // bs] * bs + pos % bs
        if windowed:
            wtable = kv.window_table(req.request_id)
            window_tables[s, : len(wtable)] = wtable
            window_slots[t : t + n] = window_tables[s, pos // bs] * bs + pos % bs
        seq_lens[s] = end
        if req.scoring:  # positions < the last prompt token predict the next prompt token
            k = max(0, min(end, req.num_prompt_tokens - 1) - start)
            if k:
                rows.scored.append((s, len(score_rows), k, start))
                score_rows.extend(range(t, t + k))
        if req.pooling is not None:
            a, b = _pooled_positions(req, start, end)
            if b > a:
                rows.pooled.append((s, len(hidden_rows), b - a, a))
                hidden_rows.extend(range(t + a - start, t + b - start))
        t += n
        seq_starts[s + 1] = t
        if end - nd == req.num_tokens and req.num_output_tokens < req.max_tokens:
            if nd:
                rows.drafts[len(sample_rows)] = (len(draft_rows), nd)
                draft_rows.extend(range(t - nd, t))
            sample_rows.append(t - 1 - nd)
            rows.samplers.append(s)
    n_sampled = len(sample_rows)
    rows.drafts = {r: (n_sampled + d0, k) for r, (d0, k) in rows.drafts.items()}
    n_sampled += len(draft_rows)
    rows.scored = [(s, n_sampled + r, k, p) for s, r, k, p in rows.scored]
    rows.hidden_rows = np.asarray(hidden_rows, dtype=np.int32)
    batch = Batch(token_ids=token_ids, positions=positions, seq_starts=seq_starts, seq_lens=seq_lens,
                  block_tables=block_tables, slot_mapping=slot_mapping,
                  logits_indices=np.asarray(sample_rows + draft_rows + score_rows, dtype=np.int32), block_size=bs,
                  window_block_tables=window_tables if windowed else None,
                  window_slot_mapping=window_slots if windowed else None)
    return batch, rows
