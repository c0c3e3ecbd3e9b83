"""One servable model: its engine, tokenizer, chat template and grammars while loaded, its
in-flight accounting, and when it was last used (for LRU eviction and keep_alive)."""

from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path

from edged.server.compute_thread import SharedForward
from edged.server.config import ServerConfig
from edged.server.errors import unavailable

log = logging.getLogger("edged.server")

UNLOADED, LOADING, LOADED, UNLOADING = "unloaded", "loading", "loaded", "unloading"


class ModelSlot:
    """What the routes use of one model (tokenizer, engine, chat, grammars(), max_len, config,
    model_name, acquire/release). The ModelManager decides when it loads and unloads."""

    def __init__(self, config: ServerConfig, metrics, *, path: str | None = None,
                 name: str | None = None, aliases=(), pinned: bool = False, check_serving=None):
        self.config = config
        self.metrics = metrics  # the server's ServerMetrics (latency histograms)
        self.model_path = path
        self._name = name  # None: the file's stem (or --model-alias), as a single-model server names it
        self.aliases = set(aliases)
        self.pinned = pinned  # loaded at start, never evicted nor expired
        self._check_server = check_serving  # the server-wide 503s (loading, draining)
        self.status = UNLOADED
        self.engine = None
        self.tokenizer = None
        self.chat = None
        self.error: str | None = None  # the last failed load
        self.estimate = None  # edged.server.model_memory.MemoryEstimate, before loading
        self.draft_bytes = 0  # --draft's model beside this one (model_memory.draft_model_bytes)
        self.in_flight = 0  # engine sequences submitted by routes and not yet finished
        self.holds = 0  # HTTP requests using this slot (a held slot is never evicted)
        self.live_ids: set[str] = set()  # request ids in the engine (aborted on drain timeout)
        self.last_used = time.monotonic()
        self.keep_alive = config.keep_alive  # seconds to stay loaded once idle (the last request's)
        self.expires_at: float | None = None  # monotonic deadline while idle; None: not expiring
        self.unloaded = threading.Event()  # set while nothing is loaded (a load after an unload waits)
        self.unloaded.set()
        self._lock = threading.Lock()
        self._grammars = None  # edged.engine.constraint.ModelGrammars, built on first use
        self._grammars_lock = threading.Lock()

    # -- identity -----------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The id clients see: the given name, else --model-alias, else the file's stem."""
        if self._name:
            return self._name
        if self.config.model_alias or not self.model_path:
            return self.config.served_model_name
        return Path(self.model_path).stem

    name = model_name

    def ids(self) -> set[str]:
        """Every string a request's `model` may use for this slot."""
        out = {self.model_name, *self.aliases}
        if self.model_path and not self._name:  # a file model: its name, stem and path
            p = Path(self.model_path)
            out.update({p.name, p.stem, str(p)})
        return out

    @property
    def max_len(self) -> int:
        """Most tokens (prompt + output) one request may hold."""
        return self.engine.max_len

    @property
    def idle(self) -> bool:
        return self.holds == 0 and self.in_flight == 0

    # -- loading ------------------------------------------------------------------------------
    def load(self) -> float:
        """Load the model and start its engine (blocking: call it from a short-lived thread).
        Returns the seconds it took."""
        from edged.loader import load

        c = self.config
        t0 = time.monotonic()
        lm = load(self.model_path, chat_template=c.chat_template, warmup=c.warmup, backend=c.backend,
                  gpu_layers=c.gpu_layers, kv_tokens=self._kv_tokens, batch_tokens=c.max_batch_tokens,
                  kv_type=c.kv_type)
        # compile the tokenizer's JIT paths now, not in the first client's request
        lm.tokenizer.encode(lm.chat.render([{"role": "user", "content": "warm up ✓"}]))
        draft = None
        if c.draft:
            from edged.engine.spec_draft import load_draft

            draft = load_draft(c.draft, lm.tokenizer, warmup=c.warmup, backend=c.backend, kv_type=c.kv_type)
        self.attach(lm.model, lm.tokenizer, lm.chat, str(lm.path), draft=draft.model if draft else None)
        if draft is not None:
            from edged.server.model_memory import draft_model_bytes

            self.draft_bytes = draft_model_bytes(draft.model, draft.gguf.file_size, self.engine.spec, c.max_seqs)
        return time.monotonic() - t0

    def _kv_tokens(self, model):
        """Tokens the KV pools will hold (what GPU layers must reserve device memory for):
        (full-attention pool, sliding-window pool or None), as edged.offload.plan takes them."""
        plan = self.plan_kv(model)
        window = plan.window_num_blocks * plan.block_size if plan.window_num_blocks else None
        return plan.num_blocks * plan.block_size, window

    def plan_kv(self, model):
        """The KV pools this server's options give `model` (edged.engine.sizing.plan_kv), of
        --kv-type (also for the memory estimate, before the model is loaded)."""
        from edged.engine.sizing import plan_kv

        c = self.config
        return plan_kv(model, c.block_size, kv_memory=c.kv_memory, ctx=min(c.ctx, model.context_length),
                       max_seqs=c.max_seqs, max_batch_tokens=c.max_batch_tokens, kv_type=c.kv_type)

    def attach(self, model, tokenizer, chat, model_path: str | None = None, *, engine_cls=None,
               engine_config_cls=None, draft=None) -> None:
        """Start an engine over an already-loaded model (and --draft's model); the slot is then loaded."""
        if engine_cls is None:
            from edged.engine.engine import Engine as engine_cls
            from edged.engine.engine import EngineConfig as engine_config_cls
        c = self.config
        ctx = min(c.ctx, model.context_length)
        kv = self.plan_kv(model)
        ecfg = engine_config_cls.from_plan(kv, max_batch_tokens=c.max_batch_tokens, max_seqs=c.max_seqs,
                                           enable_prefix_cache=c.prefix_cache, max_model_len=ctx,
                                           spec=c.spec, spec_max=c.spec_max, spec_p_min=c.draft_p_min,
                                           spec_adaptive=c.spec_adaptive)
        # forward passes on the one compute thread: one OpenMP team for all models (compute_thread)
        drafts = {"draft": SharedForward(draft)} if draft is not None else {}
        self.engine = engine_cls(SharedForward(model), tokenizer, ecfg, **drafts).start()
        self.tokenizer, self.chat = tokenizer, chat
        if model_path is not None:
            self.model_path = model_path
        self.error = None
        self.unloaded.clear()
        self.status = LOADED
        log.info("%s: KV pool: %s; context %d tokens, %d sequences", self.model_name, kv.describe(),
                 ctx, c.max_seqs)
        if draft is not None:
            log.info("%s: draft model %s proposes up to %d tokens a step", self.model_name, c.draft, c.spec_max)

    def unload(self) -> None:
        """Stop the engine and drop every reference to the model (weights, KV pools, tokenizer,
        grammars) so its memory goes back to the OS. The manager sets the status."""
        engine, self.engine = self.engine, None
        self.tokenizer = self.chat = None
        with self._grammars_lock:
            self._grammars = None
        if engine is not None:
            engine.stop()
            del engine
        self.expires_at = None
        gc.collect()  # the model graph has cycles; free the mmap and arrays now, not at some later gc
        self.unloaded.set()

    def grammars(self):
        """The model's ModelGrammars (llguidance tokenizer and grammar cache), built on the first
        constrained request (~1 s on a 262k vocabulary: call it off the event loop)."""
        with self._grammars_lock:
            if self._grammars is None:
                from edged.engine.constraint import ModelGrammars

                self._grammars = ModelGrammars(self.tokenizer, self.engine.model.vocab_size)
            return self._grammars

    # -- admission ----------------------------------------------------------------------------
    def check_serving(self) -> None:
        """Raise 503 unless this model accepts new generations."""
        if self._check_server is not None:
            self._check_server()
        if self.engine is None:
            raise unavailable(f"model '{self.model_name}' is not loaded", retry_after=5)

    def acquire(self, n: int) -> None:
        """Reserve n engine sequences, or 503 when running + queued would pass the limit."""
        self.check_serving()
        limit = self.config.max_seqs + self.config.max_queue
        with self._lock:
            if self.in_flight + n > limit:
                raise unavailable(f"server busy: {self.in_flight} requests in flight for "
                                  f"'{self.model_name}' (limit {limit}); retry later")
            self.in_flight += n

    def release(self, n: int) -> None:
        with self._lock:
            self.in_flight -= n
            self.last_used = time.monotonic()

    def abort_all(self) -> int:
        """Abort every request still in the engine (drain timeout); returns how many."""
        ids = list(self.live_ids)
        if self.engine is not None:
            for rid in ids:
                self.engine.abort(rid)
        return len(ids)

    def card(self, created: int) -> dict:
        """The /v1/models entry: OpenAI's fields, `status` (loaded, loading, unloading, unloaded)
        and max_model_len while loaded."""
        card = {"id": self.model_name, "object": "model", "created": created, "owned_by": "edged",
                "status": self.status}
        engine = self.engine
        if engine is not None:
            card["max_model_len"] = engine.max_len
        return card
