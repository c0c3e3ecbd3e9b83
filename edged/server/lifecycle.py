"""Server lifecycle: loading in the background (/health 503 until ready), admission limits, and
draining on SIGTERM/SIGINT (503 for new requests, in-flight ones finish up to --drain-timeout)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import uvicorn

from edged.server.config import ServerConfig
from edged.server.errors import unavailable
from edged.server.metrics import ServerMetrics

log = logging.getLogger("edged.server")

LOADING, READY, DRAINING, FAILED = "loading", "ready", "draining", "failed"


class ServerState:
    """What the routes share: the loaded model and engine, status, in-flight accounting."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.status = LOADING
        self.engine = None
        self.tokenizer = None
        self.chat = None
        self.model_path = None
        self.error: str | None = None
        self.created = int(time.time())
        self.metrics = ServerMetrics(lambda: self.engine)
        self.in_flight = 0  # engine sequences submitted by routes and not yet finished
        self.drain_deadline: float | None = None
        self.live_ids: set[str] = set()  # request ids in the engine (aborted on drain timeout)
        self._lock = threading.Lock()
        self._grammars = None  # edged.engine.constraint.ModelGrammars, built on first use
        self._grammars_lock = threading.Lock()
        self.on_ready = None  # callback(state) once serving

    # -- loading ------------------------------------------------------------------------------
    def load(self) -> None:
        """Load the model and start the engine (blocking; run in a thread at startup)."""
        from edged.engine.engine import Engine, EngineConfig
        from edged.loader import load

        c = self.config
        try:
            lm = load(c.model, chat_template=c.chat_template, warmup=c.warmup, backend=c.backend,
                      gpu_layers=c.gpu_layers, kv_tokens=self._kv_tokens,
                      batch_tokens=c.max_batch_tokens)
            # compile the tokenizer's JIT paths now, not in the first client's request
            lm.tokenizer.encode(lm.chat.render([{"role": "user", "content": "warm up ✓"}]))
            self.attach(lm.model, lm.tokenizer, lm.chat, str(lm.path),
                        engine_cls=Engine, engine_config_cls=EngineConfig)
        except Exception as e:  # reported on /health and in the log; the process exits 1
            log.error("loading failed: %s", e)
            self.error = f"{type(e).__name__}: {e}"
            self.status = FAILED

    def _kv_tokens(self, model):
        """Tokens the KV pools will hold (what GPU layers must reserve device memory for):
        (full-attention pool, sliding-window pool or None), as edged.offload.plan takes them."""
        plan = self._plan_kv(model)
        window = plan.window_num_blocks * plan.block_size if plan.window_num_blocks else None
        return plan.num_blocks * plan.block_size, window

    def _plan_kv(self, model):
        """The KV pools this server's options give `model` (edged.engine.sizing.plan_kv)."""
        from edged.engine.sizing import plan_kv

        c = self.config
        return plan_kv(model, c.block_size, kv_memory=c.kv_memory, ctx=min(c.ctx, model.context_length),
                       max_seqs=c.max_seqs, max_batch_tokens=c.max_batch_tokens)

    def attach(self, model, tokenizer, chat, model_path: str, *, engine_cls=None,
               engine_config_cls=None) -> None:
        """Start an engine over an already-loaded model and mark the server ready."""
        if engine_cls is None:
            from edged.engine.engine import Engine as engine_cls
            from edged.engine.engine import EngineConfig as engine_config_cls
        c = self.config
        ctx = min(c.ctx, model.context_length)
        kv = self._plan_kv(model)
        ecfg = engine_config_cls.from_plan(kv, max_batch_tokens=c.max_batch_tokens, max_seqs=c.max_seqs,
                                           enable_prefix_cache=c.prefix_cache, max_model_len=ctx)
        self.engine = engine_cls(model, tokenizer, ecfg).start()
        self.tokenizer, self.chat, self.model_path = tokenizer, chat, model_path
        log.info("KV pool: %s; context %d tokens, %d sequences", kv.describe(), ctx, c.max_seqs)
        if self.status == LOADING:  # a signal during loading already started the drain
            self.status = READY
        if self.on_ready is not None:
            self.on_ready(self)

    def grammars(self):
        """The loaded model's ModelGrammars (llguidance tokenizer and grammar cache), built on the
        first constrained request (~1 s on a 262k vocabulary: call it off the event loop)."""
        with self._grammars_lock:
            if self._grammars is None:
                from edged.engine.constraint import ModelGrammars

                self._grammars = ModelGrammars(self.tokenizer, self.engine.model.vocab_size)
            return self._grammars

    @property
    def model_name(self) -> str:
        """The id clients see: --model-alias, else the loaded file's name without .gguf."""
        if self.config.model_alias or not self.model_path:
            return self.config.served_model_name
        from pathlib import Path

        return Path(self.model_path).stem

    @property
    def max_len(self) -> int:
        """Most tokens (prompt + output) one request may hold."""
        return self.engine.max_len

    # -- admission ----------------------------------------------------------------------------
    def check_serving(self) -> None:
        """Raise 503 unless the server accepts new generations."""
        if self.status == LOADING:
            raise unavailable("the model is still loading", retry_after=5)
        if self.status == DRAINING:
            raise unavailable("the server is shutting down", retry_after=10)
        if self.status == FAILED:
            raise unavailable(f"the model failed to load: {self.error}", retry_after=60)

    def acquire(self, n: int) -> None:
        """Reserve n engine sequences, or 503 when running + queued would pass the limit."""
        self.check_serving()
        limit = self.config.max_seqs + self.config.max_queue
        with self._lock:
            if self.in_flight + n > limit:
                raise unavailable(f"server busy: {self.in_flight} requests in flight (limit "
                                  f"{limit}); retry later")
            self.in_flight += n

    def release(self, n: int) -> None:
        with self._lock:
            self.in_flight -= n

    # -- draining -----------------------------------------------------------------------------
    def begin_drain(self) -> None:
        if self.status != DRAINING:
            log.info("draining: finishing %d in-flight requests (up to %.0f s)", self.in_flight,
                     self.config.drain_timeout)
            self.status = DRAINING
            self.drain_deadline = time.monotonic() + self.config.drain_timeout

    def drain_done(self) -> bool:
        """True when the drain may end: nothing in flight, or the deadline passed (then the rest
        are aborted so their streams close)."""
        if self.in_flight <= 0:
            return True
        if time.monotonic() >= self.drain_deadline:
            log.warning("drain timeout: aborting %d requests", len(self.live_ids))
            for rid in list(self.live_ids):
                self.engine.abort(rid)
            return True
        return False

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.stop()


class EdgedServer(uvicorn.Server):
    """uvicorn, with SIGTERM/SIGINT meaning: stop admitting (503), let in-flight requests finish up
    to the drain timeout, then close. The signal is not re-raised, so the process exits 0; a
    second SIGINT forces the exit."""

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig, frame) -> None:
        if self.state.status == DRAINING and sig == signal.SIGINT:
            self.force_exit = True
        self.state.begin_drain()

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self.state.status == FAILED:
            return True
        if self.state.status == DRAINING and self.state.drain_done():
            self.should_exit = True
            return True
        return False


def run_server(state: ServerConfig | ServerState, app) -> int:
    """Serve until drained; returns the process exit code (0, or 1 if loading failed)."""
    c = state.config
    ucfg = uvicorn.Config(app, host=c.host, port=c.port, log_level=c.log_level, lifespan="on",
                          timeout_graceful_shutdown=5, h11_max_incomplete_event_size=c.max_header_bytes,
                          server_header=False, proxy_headers=False)
    server = EdgedServer(ucfg, state)
    server.run()
    if state.status == FAILED:
        print(f"edged: {state.error}", file=sys.stderr)
        return 1
    return 0
