"""Continuous-batching scheduler: one token budget per step shared by decodes and prefill chunks.

As in vLLM v1 there are no prefill and decode phases: every request just has uncomputed tokens.
Running requests go first (a decode is one token), then waiting requests fill what budget is left
with prefill chunks. When the pool runs dry the most recently admitted request is preempted by
recompute: its blocks are freed and it waits at the front of the queue with its tokens intact.
Requests that score their prompt (prompt logprobs) or pool it (embeddings) compute every position
themselves (no cached prefix), and scoring chunks share a per-step row limit (`max_scored_rows`).
A decoding request may carry draft tokens (speculative decoding, edged.engine.spec_ngram) that the
step verifies: they take only budget and blocks left once every running request has its own token,
and count as computed once the engine has accepted them (`accept_drafts`).
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass

from edged.engine.request import Request, Status
from edged.kv.manager import KVCacheManager


class AdmissionError(ValueError):
    """A request can never be served by this pool (e.g. prompt + max_tokens exceed its capacity)."""


@dataclass
class ScheduledStep:
    """What one step computes: (request, number of new tokens) in batch order."""

    items: list[tuple[Request, int]]
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_batch_tokens: int = 512, max_seqs: int = 16,
                 max_model_len: int | None = None, max_scored_rows: int | None = None):
        if max_batch_tokens < 1 or max_seqs < 1:
            raise ValueError("max_batch_tokens and max_seqs must be >= 1")
        if max_scored_rows is not None and max_scored_rows < 1:
            raise ValueError("max_scored_rows must be >= 1")
        self.kv = kv
        self.max_batch_tokens = max_batch_tokens
        self.max_seqs = max_seqs
        self.max_model_len = max_model_len
        # prompt tokens scored per step (each a [vocab] float32 logits row): bounds a step's logits
        self.max_scored_rows = min(max_scored_rows or max_batch_tokens, max_batch_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self.num_preemptions = 0

    # -- queue management --------------------------------------------------------------------
    @property
    def max_len(self) -> int:
        """Most tokens (prompt + output) one request may hold: the full-attention pool's or the
        context's size (a sliding-window pool is sized per step, never per context)."""
        limits = [n for n in (self.kv.capacity_tokens, self.max_model_len) if n]
        return min(limits) if limits else sys.maxsize

    def check_admissible(self, req: Request) -> None:
        """Raise AdmissionError for a request that could never be served."""
        if req.num_prompt_tokens < 1:
            raise AdmissionError("the prompt is empty")
        if req.max_total_tokens > self.max_len:
            raise AdmissionError(
                f"prompt ({req.num_prompt_tokens} tokens) + max_tokens ({req.max_tokens}) = "
                f"{req.max_total_tokens} exceeds the capacity of {self.max_len} tokens")

    def add(self, req: Request) -> None:
        """Queue a request; reject at once one that could never fit."""
        self.check_admissible(req)
        self.waiting.append(req)

    def finish(self, req: Request, reason: str) -> None:
        """Mark a request finished (or aborted) and free its blocks at once."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
        elif req.status is Status.WAITING:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.kv.free(req.request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep:
        budget = self.max_batch_tokens
        score_rows = self.max_scored_rows  # left for prompt-scoring chunks this step
        items: list[tuple[Request, int]] = []
        preempted: list[Request] = []

        # 1. running requests, oldest first; make room by preempting the newest
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if req.spec_tokens:
                n += self._fit_drafts(req, n, budget, len(self.running) - i - 1)
            if req.scoring:
                n = min(n, score_rows)
                if n == 0:  # this step's scoring rows are spent: it goes on next step
                    i += 1
                    continue
            while not self.kv.allocate(req.request_id, req.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    n = 0
                    break
            if n == 0:
                break
            items.append((req, n))
            budget -= n
            score_rows -= n if req.scoring else 0
            i += 1

        # 2. waiting requests (preempted ones are at the front), while budget and seats remain
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs and not preempted:
            req = self.waiting[0]
            if req.num_computed_tokens == 0 and not self.kv.table(req.request_id) and not req.needs_every_row:
                req.num_computed_tokens = self.kv.claim_cached_prefix(req.request_id, req.token_ids)
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if req.scoring:
                n = min(n, score_rows)
                if n == 0:
                    break
            if not self.kv.allocate(req.request_id, req.num_computed_tokens + n):
                self.kv.free(req.request_id)  # hold nothing while waiting; retried next step
                req.num_computed_tokens = 0
                break
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            items.append((req, n))
            budget -= n
            score_rows -= n if req.scoring else 0
        return ScheduledStep(items, preempted)

    def _fit_drafts(self, req: Request, n: int, budget: int, rest: int) -> int:
        """How many of a decoding request's drafts this step verifies (req.spec_tokens cut to
        them): what the budget and the free blocks leave once each of the `rest` running requests
        after it has its own token and a block."""
        k = min(len(req.spec_tokens), budget - n - rest) if n == 1 and not req.scoring else 0
        if k > 0 and self.kv.allocate(req.request_id, req.num_computed_tokens + n + k, reserve=rest):
            req.spec_tokens = req.spec_tokens[:k]
            return k
        req.spec_tokens = []
        return 0

    def accept_drafts(self, req: Request, accepted: int) -> None:
        """After the engine verified req's drafts: the first `accepted` of them (now at the end of
        token_ids, before the token sampled after them) have valid KV; the blocks only the rejected
        ones used are released. Only verified tokens are ever cached."""
        req.spec_tokens = []
        if accepted:
            req.num_computed_tokens += accepted
            self.kv.cache_full_blocks(req.request_id, req.token_ids, req.num_computed_tokens)
            self.kv.free_outside_window(req.request_id, req.num_computed_tokens)
        self.kv.truncate(req.request_id, req.num_tokens)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        req.spec_tokens = []
        req.num_computed_tokens = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update(self, step: ScheduledStep) -> None:
        """After the forward pass: advance computed counts, cache the now-full blocks (not an
        embedding's: its KV is dropped when it ends), and release the sliding-window blocks no later
        token reads (cached first, so they stay reusable)."""
        for req, n in step.items:
            req.num_computed_tokens += n - len(req.spec_tokens)  # drafts count once verified
            if req.num_computed_tokens >= req.num_prompt_tokens:
                req.prompt_scored = True
            if req.pooling is None:
                self.kv.cache_full_blocks(req.request_id, req.token_ids, req.num_computed_tokens)
            self.kv.free_outside_window(req.request_id, req.num_computed_tokens)
