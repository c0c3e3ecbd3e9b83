"""The engine: one background thread running schedule -> batch -> forward -> sample -> deliver.

Other threads (the HTTP server, the CLI) only call `add_request` and `abort`; those land in an
inbox the loop drains at the start of each step, so the scheduler and KV pool are single-threaded.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edged.backends.cpu.sampling import rows_scan
from edged.engine.masks import StepMasks
from edged.engine.nonfinite import NonFiniteLogits, nonfinite_rows
from edged.engine.output import OutputState
from edged.engine.pooling import Pool
from edged.engine.prompt_logprobs import PromptScores, max_scored_rows
from edged.engine.request import Request, Status
from edged.engine.runner import StepRows, build_batch
from edged.engine.scheduler import Scheduler
from edged.engine.sizing import KVPlan, available_memory, kv_layout, window_blocks_needed, window_pool_blocks
from edged.engine.spec_draft import P_MIN, DraftModelProposer
from edged.engine.spec_governor import SpecGovernor
from edged.engine.spec_ngram import NgramProposer, draft_room
from edged.engine.stream import Delta, Outbox, RequestStream
from edged.kv.block_pool import BlockPool
from edged.kv.manager import KVCacheManager
from edged.sampling import Sampler, SamplingParams

log = logging.getLogger("edged.engine")


@dataclass
class EngineConfig:
    num_blocks: int  # full-attention layers' pool (every layer's when there is one KV group)
    block_size: int = 16
    max_batch_tokens: int = 512
    max_seqs: int = 16
    enable_prefix_cache: bool = True
    max_model_len: int | None = None
    # sliding-window layers' pool; None: room for max_seqs running requests (sizing.window_pool_blocks)
    window_num_blocks: int | None = None
    # False: sliding-window layers share the full layers' blocks and keep all of them (one group)
    free_window_blocks: bool = True
    # prompt tokens scored (prompt logprobs) per step; None: prompt_logprobs.max_scored_rows
    max_scored_rows: int | None = None
    # speculative decoding: None (off), "ngram" (drafts from the context, edged.engine.spec_ngram)
    # or "draft" (from the Engine's draft model, edged.engine.spec_draft), at most spec_max draft
    # tokens verified per sequence and step
    spec: str | None = None
    spec_max: int = 8
    # "draft": the draft stops where its top probability falls below this (spec_draft.P_MIN)
    spec_p_min: float = P_MIN
    # "draft": draft only at the batch sizes where drafting measured faster (spec_governor)
    spec_adaptive: bool = True

    @classmethod
    def from_plan(cls, plan: KVPlan, **settings) -> "EngineConfig":
        """The pools of `plan` (edged.engine.sizing.plan_kv) with the other settings given."""
        return cls(num_blocks=plan.num_blocks, window_num_blocks=plan.window_num_blocks,
                   block_size=plan.block_size, **settings)


@dataclass
class EngineStats:
    running: int
    waiting: int
    blocks_total: int  # the main (full-attention) pool's blocks
    blocks_used: int
    blocks_cached_free: int
    blocks_free: int
    prefix_hit_rate: float
    preemptions: int
    steps: int
    last_step_s: float
    prompt_tokens: int
    generated_tokens: int
    tokens_in_kv: int  # tokens the main pool holds: computed ones and those the running step stores
    # the sliding-window layers' pool (zeros when there is one KV group)
    window_blocks_total: int = 0
    window_blocks_used: int = 0
    window_blocks_cached_free: int = 0
    window_blocks_free: int = 0
    window_tokens_in_kv: int = 0  # tokens that pool must hold: min(computed, window - 1) + in step
    kv_bytes_used: int = 0  # bytes of the blocks held by requests, both pools
    kv_bytes_needed: int = 0  # bytes the held tokens need: tokens per pool x its bytes per token
    kv_bytes_total: int = 0  # bytes of K and V the pools allocated, both pools
    kv_type: str = "f32"  # the caches' element type (f32, f16, q8_0)
    nonfinite_rows: int = 0  # sampled rows whose logits held NaN or inf (each failed its request)
    embedding_inputs: int = 0  # embedding requests completed
    embedding_tokens: int = 0  # their prompt tokens
    spec_draft_tokens: int = 0  # draft tokens verified (speculative decoding)
    spec_accepted_tokens: int = 0  # of those, the ones the model's own choice confirmed
    spec_skipped_steps: int = 0  # decode steps the governor ran without drafts (spec_adaptive)


class StepTimer(Protocol):
    """Told where each engine step's phases end, on the engine thread (edged.bench.profile's
    StepProfiler is one): begin, then phase("schedule"), ("build_batch", tokens), ("forward"),
    ("update"), and when rows are sampled ("sample", rows), ("deliver")."""

    def begin(self) -> None: ...

    def phase(self, name: str, items: int = 0) -> None: ...


class _Untimed:
    def begin(self) -> None:
        pass

    def phase(self, name: str, items: int = 0) -> None:
        pass


_UNTIMED = _Untimed()


class _Live:
    """Engine-side state of one request."""

    __slots__ = ("req", "stream", "out", "params", "constraint", "scores", "pool")

    def __init__(self, req, stream, out, params, constraint=None):
        self.req, self.stream, self.out, self.params = req, stream, out, params
        self.constraint = constraint  # edged.engine.constraint.RequestConstraint or None
        k = req.prompt_logprobs
        self.scores = PromptScores(req.prompt_ids, k) if k is not None else None
        self.pool = Pool(req.pooling, req.num_prompt_tokens) if req.pooling is not None else None

    def take_scores(self):
        """The prompt logprobs for the first delta after the prefill (None: not asked, or sent)."""
        return self.scores.take() if self.scores is not None else None


def _check_host_memory(need: int) -> None:
    """ValueError when the host KV pools would not fit the RAM the OS has available: they are
    written at allocation (resident from the start), so an oversized pool would swap or be killed."""
    have = available_memory()
    if need > have:
        raise ValueError(f"the KV cache needs {need / 2**20:,.0f} MiB of RAM and {have / 2**20:,.0f} MiB are "
                         "available: lower --ctx or --max-seqs, or set --kv-memory")


def _decode_only(step, batch: int) -> bool:
    """Whether a scheduled step runs just `batch` decoding sequences: each its next token and
    the drafts it verifies, no prompt chunk."""
    return len(step.items) == batch and all(n == 1 + len(req.spec_tokens) for req, n in step.items)


def _proposer(model, config: EngineConfig, draft):
    """config.spec's draft proposer (None: no speculation)."""
    if config.spec not in (None, "ngram", "draft"):
        raise ValueError(f"spec must be None, ngram or draft, got {config.spec!r}")
    if (config.spec == "draft") != (draft is not None):
        raise ValueError("a draft model goes with spec 'draft', and spec 'draft' needs one")
    if config.spec == "draft":
        if draft.vocab_size != model.vocab_size:
            raise ValueError(f"the draft model's vocabulary has {draft.vocab_size} tokens, the target's "
                             f"{model.vocab_size}")
        # as many tokens as the target's pool, and each sequence's drafts past its last block
        tokens = config.num_blocks * config.block_size + config.max_seqs * (config.spec_max + config.block_size)
        return DraftModelProposer(draft, config.spec_max, tokens, config.block_size, config.spec_p_min)
    return NgramProposer(model.vocab_size, config.spec_max) if config.spec else None


class Engine:
    """Continuous-batching generation over one model. Thread-safe entry points: add_request,
    abort, stats, stop."""

    def __init__(self, model, tokenizer, config: EngineConfig, draft=None):
        """draft: the model proposing tokens for config.spec "draft" (the target's vocabulary:
        spec_draft.check_same_vocabulary)."""
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self._init_kv(model, config)
        scored = config.max_scored_rows or max_scored_rows(model.vocab_size, config.max_batch_tokens)
        self.scheduler = Scheduler(self.kv, config.max_batch_tokens, config.max_seqs,
                                   config.max_model_len or model.context_length, scored)
        self._check_window_pool()
        self.sampler = Sampler()
        self.sampler.warm_up()
        # the sampled rows' argmax and finiteness: the server's model runs big scans on its compute thread
        self._rows_scan = getattr(model, "rows_scan", rows_scan)
        self.masks = StepMasks(model.vocab_size)  # grammar masks of constrained rows
        self.spec = _proposer(model, config, draft)
        self._spec_drafted = self._spec_accepted = 0
        # a draft model's drafts cost passes and catch-ups; the n-gram method's cost nothing to make,
        # and its own per-sequence estimate keeps them short (docs/SERVER.md, When it drafts)
        self.governor = SpecGovernor() if config.spec == "draft" and config.spec_adaptive else None
        self._governed: tuple[int, bool, int] | None = None  # this step's (batch, drafted, accepted before)
        self._live: dict[str, _Live] = {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox = Outbox()  # this step's deltas, flushed once per step (engine thread only)
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self._steps = 0
        self._in_flight: dict[str, int] = {}  # request id -> tokens the running step is storing
        self._last_step_s = 0.0
        self._prompt_tokens = 0
        self._generated_tokens = 0
        self._nonfinite_rows = 0
        self._embedding_inputs = 0
        self._embedding_tokens = 0
        self.step_timer: StepTimer | None = None  # read once per step: may be set while running

    def _init_kv(self, model, config: EngineConfig) -> None:
        """The KV pools and the model's caches: one group, or a full-attention group plus a
        sliding-window group whose blocks are freed as requests move past the window."""
        bs = config.block_size
        self.layout = kv_layout(model, config.free_window_blocks)
        self.pool = BlockPool(config.num_blocks, bs, config.enable_prefix_cache)
        self.window_pool = None
        if self.layout.two_groups:
            window_blocks = config.window_num_blocks or window_pool_blocks(
                self.layout.window, bs, config.max_batch_tokens, config.max_seqs, config.num_blocks)
            self.window_pool = BlockPool(window_blocks, bs, config.enable_prefix_cache)
            _check_host_memory(model.kv_host_bytes(config.num_blocks, bs, window_blocks))
            self.kv_cache = model.allocate_kv(config.num_blocks, bs, window_num_blocks=window_blocks)
        else:
            _check_host_memory(model.kv_host_bytes(config.num_blocks, bs))
            self.kv_cache = model.allocate_kv(config.num_blocks, bs)
        self.kv = KVCacheManager(self.pool, self.layout.window, self.window_pool)

    def _check_window_pool(self) -> None:
        """ValueError when the sliding-window pool cannot serve even one request alone (it would
        wait forever): it needs a window and a step's tokens, or the longest request's blocks."""
        sliding = self.window_pool or (self.pool if self.layout.window else None)
        if sliding is None:
            return
        one = min(window_blocks_needed(self.layout.window, self.pool.block_size, self.config.max_batch_tokens),
                  self.kv.blocks_needed(self.max_len))
        if sliding.num_blocks < one:
            raise ValueError(f"a sliding-window pool of {sliding.num_blocks} blocks cannot hold one "
                             f"request's window and step ({one} blocks)")

    # -- public, any thread -----------------------------------------------------------------
    @property
    def max_len(self) -> int:
        """Most tokens (prompt + output) one request may hold (pool or context size)."""
        return self.scheduler.max_len

    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._loop, name="edged-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.masks.close()

    def add_request(self, prompt_ids, params: SamplingParams, request_id: str | None = None,
                    loop=None, sink=None, constraint=None) -> RequestStream:
        """Queue a generation; returns its stream. Validation errors raise here, before queueing
        (vocab range, empty prompt, too long for the pool or context).

        loop: deliver the deltas on this asyncio loop (`async for` the stream there), or, with
        `sink`, call sink(delta) on that loop for each one instead of queueing them.
        constraint: an edged.engine.constraint.RequestConstraint (its matcher already compiled):
        the request's tokens are sampled under its grammar. params.prompt_logprobs scores every
        prompt token in the prefill (the first delta after it carries them); params.max_tokens 0
        runs the prefill only (finish "length", no token)."""
        max_tokens = params.max_tokens if params.max_tokens is not None else 256
        req = Request(request_id or f"req-{next(self._ids)}", self._checked_ids(prompt_ids),
                      max_tokens=max_tokens, sampling=params, prompt_logprobs=params.prompt_logprobs)
        eos = frozenset(self.tokenizer.eos_ids) | frozenset(params.stop_token_ids)
        out = OutputState(self.tokenizer.stream_decoder(), tuple(params.stop), eos, params.ignore_eos)
        return self._queue(_Live(req, None, out, params, constraint), loop, sink)

    def add_embedding(self, prompt_ids, pooling: str, request_id: str | None = None, loop=None,
                      sink=None) -> RequestStream:
        """Queue an embedding: a prefill-only request batched with the generations, whose
        final-normed hidden states are pooled ("mean", "last" or "cls"); its one delta (finish
        "stop") carries the pooled float32 [n_embd] vector, not normalised, in `embedding`. Its KV
        is freed at the end and never enters the prefix cache. loop/sink as add_request."""
        req = Request(request_id or f"emb-{next(self._ids)}", self._checked_ids(prompt_ids),
                      max_tokens=0, pooling=pooling)
        return self._queue(_Live(req, None, None, None), loop, sink)

    def _checked_ids(self, prompt_ids) -> list[int]:
        prompt_ids = [int(t) for t in prompt_ids]
        vocab = self.model.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
        return prompt_ids

    def _queue(self, live: _Live, loop, sink) -> RequestStream:
        self.scheduler.check_admissible(live.req)
        stream = live.stream = RequestStream(live.req.request_id)
        if loop is not None:
            stream.bind_loop(loop, sink)
        elif sink is not None:
            raise ValueError("a sink needs the loop to call it on")
        self._inbox.put(("add", live))
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request, queued or running; its blocks are freed at the next step boundary."""
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> EngineStats:
        s, p, w, lay = self.scheduler, self.pool, self.window_pool, self.layout
        # (computed, being stored by the running step) per request; a sliding-window layer needs
        # the window - 1 keys before the step's first token plus the step's own
        held = [(r.num_computed_tokens, self._in_flight.get(r.request_id, 0)) for r in s.running]
        windowed = sum(min(c, lay.window - 1) + n for c, n in held) if lay.window else 0
        tokens = windowed if lay.window and not lay.two_groups else sum(c + n for c, n in held)
        window_tokens = windowed if w is not None else 0
        bpt, window_bpt = lay.bytes_per_token, lay.window_bytes_per_token
        window_used = w.num_used if w is not None else 0
        return EngineStats(
            running=len(s.running), waiting=len(s.waiting), blocks_total=p.num_blocks,
            blocks_used=p.num_used, blocks_cached_free=p.num_cached_free, blocks_free=p.num_free,
            prefix_hit_rate=self.kv.prefix_hit_rate, preemptions=s.num_preemptions,
            steps=self._steps, last_step_s=self._last_step_s, prompt_tokens=self._prompt_tokens,
            generated_tokens=self._generated_tokens, tokens_in_kv=tokens,
            window_blocks_total=w.num_blocks if w is not None else 0, window_blocks_used=window_used,
            window_blocks_cached_free=w.num_cached_free if w is not None else 0,
            window_blocks_free=w.num_free if w is not None else 0, window_tokens_in_kv=window_tokens,
            kv_bytes_used=p.block_size * (p.num_used * bpt + window_used * window_bpt),
            kv_bytes_needed=tokens * bpt + window_tokens * window_bpt,
            kv_bytes_total=p.block_size * (p.num_blocks * bpt + (w.num_blocks if w is not None else 0) * window_bpt),
            kv_type=lay.kv_type,
            nonfinite_rows=self._nonfinite_rows, embedding_inputs=self._embedding_inputs,
            embedding_tokens=self._embedding_tokens, spec_draft_tokens=self._spec_drafted,
            spec_accepted_tokens=self._spec_accepted,
            spec_skipped_steps=self.governor.skipped if self.governor is not None else 0)

    def generate(self, prompt_ids, params: SamplingParams) -> list[Delta]:
        """Blocking convenience: run one request to completion (engine must be started)."""
        return list(self.add_request(prompt_ids, params))

    # -- engine thread ------------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                self._outbox.flush()  # abort deltas
                return
            if kind == "add":
                self._live[arg.req.request_id] = arg
                self.scheduler.add(arg.req)
                self._prompt_tokens += arg.req.num_prompt_tokens
            else:
                live = self._live.get(arg)
                if live is not None:
                    self._finish(live, "abort")

    def _finish(self, live: _Live, reason: str, text: str = "", error: str | None = None,
                token_id: int | None = None, logprob=None, embedding=None) -> None:
        self.scheduler.finish(live.req, reason)
        self.sampler.release(live.req.request_id)
        if self.spec is not None:
            self.spec.release(live.req.request_id)
        self._live.pop(live.req.request_id, None)
        self._outbox.put(live.stream, Delta(
            token_id, text, *(logprob or (None, None)), finish_reason=reason, error=error,
            num_prompt_tokens=live.req.num_prompt_tokens, num_output_tokens=live.req.num_output_tokens,
            prompt_logprobs=live.take_scores() if error is None and reason != "abort" else None,
            embedding=embedding))

    def _loop(self) -> None:
        while not self._stop:
            self._drain_inbox()
            if not self.scheduler.has_work:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                self._step()
            except Exception as e:  # a failed step fails its requests, never the loop
                log.exception("engine step failed")
                self._in_flight = {}  # nothing of this step was stored; stats() must not count it
                # the batch's requests fail and free their blocks; waiting ones run next step
                for live in list(self._live.values()):
                    if live.req in self.scheduler.running:
                        self._finish(live, "error", error=f"{type(e).__name__}: {e}")
            finally:
                self._outbox.flush()

    def _step(self) -> None:
        t0 = time.perf_counter()
        timer = self.step_timer or _UNTIMED
        timer.begin()
        if self.spec is not None:
            self._propose_drafts()
        step = self.scheduler.schedule()
        if self._governed is not None and not _decode_only(step, self._governed[0]):
            self._governed = None  # a prompt chunk joined: not the governor's kind of step
        timer.phase("schedule")
        self._in_flight = {req.request_id: n for req, n in step.items}  # replaced whole: stats() reads it
        if not step.items:
            return
        batch, rows = build_batch(step, self.kv)
        samplers = rows.samplers
        timer.phase("build_batch", batch.n_tokens)
        lives = [self._live[step.items[i][0].request_id] for i in samplers]
        pending = self.masks.submit(lives)  # computed on a worker thread while the forward runs
        try:
            if rows.hidden_rows.shape[0]:  # embeddings' hidden rows come from the same pass
                logits, hidden = self.model.forward_hidden(batch, self.kv_cache, rows.hidden_rows)
            else:
                logits, hidden = self.model.forward(batch, self.kv_cache), None
        finally:
            masked = self.masks.collect(pending)
        timer.phase("forward")
        self.scheduler.update(step)
        self._in_flight = {}
        timer.phase("update")
        self._prefill_outputs(step, rows, logits, hidden)
        if samplers:
            full_logits = logits
            logits = logits[: len(samplers)]  # [len(samplers), vocab] (a view); drafts', scored rows follow
            # one pass: each row's finiteness (before the grammar masks add their -inf) and argmax
            argmax, finite = self._rows_scan(logits)
            bad = np.flatnonzero(~finite).tolist()
            logits, failed = self.masks.apply(masked, logits)
            if masked is not None:
                argmax = None  # the masks changed the rows
            results = self._sample_finite(logits, lives, bad) if bad else self._sample(logits, lives, argmax)
            for r, err in failed.items():
                results[r] = RuntimeError(err)
            for r, (d0, k) in rows.drafts.items():  # draft rows follow the sampled ones
                results[r] = self._verify(lives[r], results[r], full_logits[d0 : d0 + k])
            timer.phase("sample", len(lives))
            self._deliver(lives, results)
            timer.phase("deliver")
        self._steps += 1
        self._last_step_s = time.perf_counter() - t0
        if self._governed is not None:  # tell the governor what the decode step it decided yielded
            batch, drafted, accepted = self._governed
            self._governed = None
            self.governor.record(batch, drafted, batch + self._spec_accepted - accepted, self._last_step_s)

    def _prefill_outputs(self, step, rows: StepRows, logits: np.ndarray, hidden) -> None:
        """Prompt scores and pooled hidden states of this step's chunks; then the prefill-only
        requests (embeddings, max_tokens 0) whose prompt is done finish."""
        items = step.items
        for s, r0, k, p0 in rows.scored:
            live = self._live.get(items[s][0].request_id)
            if live is None or live.scores is None:
                continue
            block = logits[r0 : r0 + k]  # [k, vocab]
            bad = nonfinite_rows(block)
            if bad:
                self._nonfinite_rows += 1
                self._finish(live, "error", error=str(NonFiniteLogits(p0 + bad[0])))
                continue
            live.scores.add(block, p0)
        for s, h0, k, p0 in rows.pooled:
            live = self._live.get(items[s][0].request_id)
            if live is not None:
                live.pool.add(hidden[h0 : h0 + k], p0)
        for req, _ in items:
            if req.max_tokens or req.num_computed_tokens < req.num_prompt_tokens:
                continue
            live = self._live.get(req.request_id)
            if live is None:
                continue
            if live.pool is None:
                self._finish(live, "length")
                continue
            vec = live.pool.result()
            if not np.isfinite(vec).all():
                self._finish(live, "error", error="the pooled hidden states are not finite (NaN or "
                             "inf); the model file or its metadata is broken")
                continue
            self._embedding_inputs += 1
            self._embedding_tokens += req.num_prompt_tokens
            self._finish(live, "stop", embedding=vec)

    def _sample_finite(self, logits: np.ndarray, lives: list[_Live], bad: list[int]) -> list:
        """Like _sample, for the finite rows only; each row in `bad` gets NonFiniteLogits."""
        self._nonfinite_rows += len(bad)
        results: list = [None] * len(lives)
        for r in bad:
            req = lives[r].req
            results[r] = NonFiniteLogits(req.num_tokens - 1)
            log.warning("request %s: %s", req.request_id, results[r])
        good = [r for r in range(len(lives)) if results[r] is None]
        if good:
            for r, res in zip(good, self._sample(logits[good], [lives[r] for r in good])):
                results[r] = res
        return results

    def _sample(self, logits: np.ndarray, lives: list[_Live], argmax: np.ndarray | None = None) -> list:
        """(token, logprob info) per row, or the exception that row's sampling raised; argmax:
        the rows' argmax when the step already has it (rows_scan)."""
        ids = [lv.req.request_id for lv in lives]
        params = [lv.params for lv in lives]
        hist = [lv.req.token_ids for lv in lives]
        try:
            tokens, infos = self.sampler.sample(logits, ids, params, hist, argmax=argmax)
            return list(zip(tokens.tolist(), infos))
        except Exception:  # one bad row must not fail the others: retry row by row
            results = []
            for r, lv in enumerate(lives):
                try:
                    t, inf = self.sampler.sample(logits[r : r + 1], ids[r : r + 1], params[r : r + 1],
                                                 hist[r : r + 1])
                    results.append((int(t[0]), inf[0]))
                except Exception as e:
                    results.append(e)
            return results

    def _propose_drafts(self) -> None:
        """Set each running request's drafts for this step (spec_ngram, spec_draft): decoding
        ones without a grammar (constrained requests never speculate: their drafts would need the
        matcher's mask at every draft position) that did not opt out (params.speculative)."""
        spec, max_len, running = self.spec, self.max_len, self.scheduler.running
        asks = []  # (request, drafts it may verify)
        decoding = 0
        for req in running:
            req.spec_tokens = []
            live = self._live[req.request_id]
            k = draft_room(req, spec.spec_max, max_len)
            decoding += req.num_tokens - req.num_computed_tokens == 1
            if k and live.constraint is None and live.params.speculative:
                asks.append((req, k))
        self._governed = None
        if asks and self.governor is not None:
            joining = min(len(self.scheduler.waiting), self.scheduler.max_seqs - len(running))
            batch = len(running) + joining
            if decoding < len(running) or joining:  # prompt chunks too: the figures say, unmeasured
                drafting = self.governor.prefers_drafts(batch)
            else:
                drafting = self.governor.drafting(batch)
                self._governed = (batch, drafting, self._spec_accepted)
            if not drafting:
                return
        if asks:
            try:
                drafts = spec.propose_batch([(r.request_id, r.token_ids, k) for r, k in asks])
            except Exception:  # drafts are optional: a failing draft model must not fail requests
                log.exception("speculative decoding failed: this model goes on without it")
                self.spec = self.governor = self._governed = None
                return
            for (req, _), d in zip(asks, drafts):
                req.spec_tokens = d

    def _verify(self, live: _Live, first, rows: np.ndarray) -> list:
        """The tokens of a request whose step verified drafts: `first` (sampled after its last
        known token), then, while each sampled token equals the draft in its place, the token
        sampled from the row after that draft (rows float32 [k, vocab]). Each row goes through the
        request's whole sampling pipeline with the accepted drafts in its history: keeping a draft
        only where that draw picks it is rejection sampling against a one-token proposal (accepted
        with probability p(draft), else a draw from p without it, renormalised), so the outputs are
        distributed as without drafts, and one draw per output token repeats a seeded request."""
        req, p = live.req, live.params
        drafts = req.spec_tokens
        out = [first]
        j = 0  # drafts accepted
        while j < len(drafts) and not isinstance(out[-1], Exception) and out[-1][0] == drafts[j]:
            j += 1
            row = rows[j - 1 : j]  # [1, vocab]: the logits after draft j - 1
            if nonfinite_rows(row):
                self._nonfinite_rows += 1
                out.append(NonFiniteLogits(req.num_tokens + j - 1))
                break
            hist = req.token_ids + drafts[:j] if p.has_penalties else None
            try:
                t, info = self.sampler.sample(row, [req.request_id], [p], [hist])
                out.append((int(t[0]), info[0]))
            except Exception as e:
                out.append(e)
        self._spec_drafted += len(drafts)
        self._spec_accepted += j
        self.spec.record(req.request_id, len(drafts), j)
        return out

    def _deliver(self, lives: list[_Live], results: list) -> None:
        for lv, res in zip(lives, results):
            if lv.req.status is Status.FINISHED:  # failed while scoring its prompt this step
                continue
            if not isinstance(res, list):
                self._deliver_one(lv, res)
                continue
            for one in res:  # a verified draft's tokens in order, until one ends the request
                self._deliver_one(lv, one)
                if lv.req.status is Status.FINISHED:
                    break
            else:
                self.scheduler.accept_drafts(lv.req, len(res) - 1)

    def _deliver_one(self, lv: _Live, res) -> None:
        """One sampled token (or the exception its row raised) of one request."""
        out, max_len = self._outbox, self.max_len
        if isinstance(res, Exception):
            error = str(res) if isinstance(res, NonFiniteLogits) else f"{type(res).__name__}: {res}"
            self._finish(lv, "error", error=error)
            return
        token, info = res
        req = lv.req
        c = lv.constraint
        if c is not None and not c.consume(token):
            self._finish(lv, "error", error=f"constraint failed: {c.error}")
            return
        req.token_ids.append(token)
        self._generated_tokens += 1
        lp = None
        if info is not None:
            lp = (info.token_logprob,
                  list(zip(info.top_ids.tolist(), info.top_logprobs.tolist())))
        n_out = req.num_output_tokens
        text, reason = lv.out.on_token(token, n_out >= req.max_tokens)
        if reason is None and req.num_tokens >= max_len:
            text, reason = text + lv.out.pending, "length"
        if reason is None and c is not None and c.stopped:  # the grammar's document is complete
            text, reason = text + lv.out.drain(), "stop"
        if reason is not None:
            self._finish(lv, reason, text=text, token_id=token, logprob=lp)
        elif lv.scores is not None and not lv.scores.sent:
            out.put(lv.stream, Delta(token, text, *(lp or (None, None)), None, None,
                                     req.num_prompt_tokens, n_out, lv.take_scores()))
        elif lp is None:
            out.put(lv.stream, Delta(token, text, None, None, None, None, req.num_prompt_tokens, n_out))
        else:
            out.put(lv.stream, Delta(token, text, lp[0], lp[1], None, None, req.num_prompt_tokens, n_out))
