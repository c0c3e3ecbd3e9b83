"""Server lifecycle: loading in the background (/health 503 until ready), and draining on
SIGTERM/SIGINT (503 for new requests, in-flight ones of every model finish up to --drain-timeout)."""

from __future__ import annotations

import logging
import signal
import sys
import time

import uvicorn

from edged.server.config import ServerConfig
from edged.server.errors import unavailable
from edged.server.metrics import ServerMetrics
from edged.server.model_manager import ModelManager, store_aliases

log = logging.getLogger("edged.server")

LOADING, READY, DRAINING, FAILED = "loading", "ready", "draining", "failed"


class ServerState:
    """What the routes share: the server's status, metrics and drain, and the models
    (`models`, a ModelManager of ModelSlots: engine, tokenizer, chat and accounting per model)."""

    def __init__(self, config: ServerConfig, store=None):
        self.config = config
        self.status = LOADING
        self.error: str | None = None
        self.created = int(time.time())
        self.metrics = ServerMetrics(lambda: self.models.loaded())
        self.models = ModelManager(config, self.metrics, self.check_serving, store=store)
        self.drain_deadline: float | None = None
        self.on_ready = None  # callback(state) once serving

    # -- loading ------------------------------------------------------------------------------
    def load(self) -> None:
        """Start serving (blocking; run in a thread at startup): MODEL (a path or a store name)
        is loaded now and pinned; without it every store model is servable and loads on demand,
        or, with an empty store, the default model is loaded as MODEL would be."""
        c = self.config
        try:
            if c.model is None and self.models.store is not None and self.models.store.list():
                self.models.serve_store = True
                self.models.refresh()
                self._ready()
                for name in c.preload:
                    self.models.preload(name)
                return
            self.models.load_pinned(self.models.new_slot(**_pinned_source(c, self.models.store),
                                                         pinned=True))
            self._ready()
        except Exception as e:  # reported on /health and in the log; the process exits 1
            log.error("loading failed: %s", e)
            self.error = f"{type(e).__name__}: {e}"
            self.status = FAILED

    def attach(self, model, tokenizer, chat, model_path: str, *, engine_cls=None,
               engine_config_cls=None):
        """Serve an already-loaded model (pinned) and mark the server ready; returns its slot."""
        slot = self.models.new_slot(path=model_path, pinned=True)
        slot.attach(model, tokenizer, chat, model_path, engine_cls=engine_cls,
                    engine_config_cls=engine_config_cls)
        self.models.add_attached(slot)
        self._ready()
        return slot

    def _ready(self) -> None:
        if self.status == LOADING:  # a signal during loading already started the drain
            self.status = READY
        if self.on_ready is not None:
            self.on_ready(self)

    @property
    def model_name(self) -> str:
        """What the ready line names: the pinned model, else the store's models."""
        names = [s.model_name for s in self.models.listed()]
        return names[0] if len(names) == 1 else f"{len(names)} models from the store"

    @property
    def in_flight(self) -> int:
        return self.models.in_flight

    # -- admission ----------------------------------------------------------------------------
    def check_serving(self) -> None:
        """Raise 503 unless the server accepts new generations."""
        if self.status == LOADING:
            raise unavailable("the model is still loading", retry_after=5)
        if self.status == DRAINING:
            raise unavailable("the server is shutting down", retry_after=10)
        if self.status == FAILED:
            raise unavailable(f"the model failed to load: {self.error}", retry_after=60)

    # -- draining -----------------------------------------------------------------------------
    def begin_drain(self) -> None:
        if self.status != DRAINING:
            log.info("draining: finishing %d in-flight requests (up to %.0f s)", self.in_flight,
                     self.config.drain_timeout)
            self.status = DRAINING
            self.drain_deadline = time.monotonic() + self.config.drain_timeout

    def drain_done(self) -> bool:
        """True when the drain may end: nothing in flight in any model, or the deadline passed
        (then the rest are aborted so their streams close)."""
        if self.in_flight <= 0:
            return True
        if time.monotonic() >= self.drain_deadline:
            aborted = sum(s.abort_all() for s in self.models.loaded())
            log.warning("drain timeout: aborting %d requests", aborted)
            return True
        return False

    def shutdown(self) -> None:
        self.models.shutdown()


def _pinned_source(config: ServerConfig, store) -> dict:
    """ModelSlot keywords for MODEL: a store entry (its id "name:tag"; a stored model wins over
    a same-named file, as edged.model_path has it), else a path (None: the default model)."""
    from edged.model_path import resolve_model_path
    from edged.store import is_store_name

    model = config.model
    if model is not None and store is not None and is_store_name(model) and store.has(model):
        m = store.get(model)
        return dict(path=str(store.resolve(m.name)), name=config.model_alias or m.name,
                    aliases=store_aliases(m.name))
    return dict(path=str(resolve_model_path(model)))


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
