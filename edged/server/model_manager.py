"""The models one server serves: a ModelSlot each (a pinned MODEL, or every model-store entry),
loaded on demand in a thread while the others keep serving, evicted least-recently-used when a
load would pass --max-loaded-models / --max-memory, unloaded when their keep_alive runs out."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time

from edged.server.errors import APIError, bad_request, unavailable
from edged.store import full_name, is_store_name
from edged.server.model_memory import estimate, estimate_file, fmt_bytes, parse_max_memory
from edged.server.model_slot import LOADED, LOADING, UNLOADED, UNLOADING, ModelSlot

log = logging.getLogger("edged.server")


class Hold:
    """One HTTP request's use of a slot: taken before its model loads (so a fresh load is not
    evicted under it), released when the response ends; keep_alive is the request's (None: the
    server's --keep-alive)."""

    __slots__ = ("slot", "keep_alive")

    def __init__(self, slot: ModelSlot):
        self.slot, self.keep_alive = slot, None


class ModelManager:
    def __init__(self, config, metrics, check_serving=None, store=None):
        self.config = config
        self.metrics = metrics
        self.store = store  # edged.store.ModelStore, or None
        self.serve_store = False  # every store entry is servable (edged serve without MODEL)
        self._check_serving = check_serving
        self.slots: dict[str, ModelSlot] = {}
        self.max_memory = parse_max_memory(config.max_memory)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # wakes the reaper when an expiry changes
        self._loads: dict[str, concurrent.futures.Future] = {}
        self._reaper: threading.Thread | None = None
        self._stopping = False

    # -- slots --------------------------------------------------------------------------------
    def new_slot(self, **kw) -> ModelSlot:
        return ModelSlot(self.config, self.metrics, check_serving=self._check_serving, **kw)

    def add(self, slot: ModelSlot) -> ModelSlot:
        with self._lock:
            self.slots[slot.model_name] = slot
        return slot

    def refresh(self) -> None:
        """Follow the store: a slot for every entry (pulled since start included); slots of
        removed entries go once unloaded."""
        if not self.serve_store:
            return
        entries = {m.name: m for m in self.store.list()}
        with self._lock:
            for name in entries:
                if name not in self.slots:
                    self.slots[name] = self.new_slot(path=str(self.store.resolve(name)), name=name,
                                                     aliases=store_aliases(name))
            for name, s in list(self.slots.items()):
                if name not in entries and not s.pinned and s.status == UNLOADED and s.holds == 0:
                    del self.slots[name]

    def listed(self) -> list[ModelSlot]:
        self.refresh()
        with self._lock:
            return sorted(self.slots.values(), key=lambda s: s.model_name)

    def loaded(self) -> list[ModelSlot]:
        with self._lock:
            return [s for s in self.slots.values() if s.engine is not None]

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in list(self.slots.values()))

    def resolve(self, model: str | None) -> ModelSlot:
        """The slot a request's `model` names (None: the default); 404 listing the available ids."""
        self.refresh()
        with self._lock:
            slots = list(self.slots.values())
        if model is None:
            return self._default(slots)
        spellings = {model}
        if is_store_name(model):  # store names are case-insensitive, ":latest" by default
            spellings.add(full_name(model))
        for s in slots:
            if spellings & s.ids():
                return s
        names = ", ".join(sorted(s.model_name for s in slots)) or "none"
        raise APIError(404, f"model '{model}' not found; available models: {names}", param="model",
                       code="model_not_found")

    def _default(self, slots: list[ModelSlot]) -> ModelSlot:
        """A request without `model`: the pinned model, the store's default chat model, the
        single loaded one, the single servable one; else 400."""
        pinned = [s for s in slots if s.pinned]
        if pinned:
            return pinned[0]
        default = self.store.default_chat_model() if self.serve_store else None
        by_name = {s.model_name: s for s in slots}
        if default in by_name:
            return by_name[default]
        loaded = [s for s in slots if s.status == LOADED]
        if len(loaded) == 1:
            return loaded[0]
        if len(slots) == 1:
            return slots[0]
        names = ", ".join(sorted(by_name)) or "none"
        raise bad_request(f"'model' is required: this server serves {names}", "model")

    # -- requests -----------------------------------------------------------------------------
    def hold(self, slot: ModelSlot) -> Hold:
        with self._lock:
            slot.holds += 1
            slot.expires_at = None
        return Hold(slot)

    def release(self, hold: Hold) -> None:
        """The request is over: the slot's idle clock starts (keep_alive 0 unloads it now)."""
        s = hold.slot
        with self._cv:
            s.holds -= 1
            s.last_used = time.monotonic()
            if hold.keep_alive is not None:
                s.keep_alive = hold.keep_alive  # Ollama: the last request's keep_alive holds
            elif not s.pinned:
                s.keep_alive = self.config.keep_alive
            if s.holds == 0 and not s.pinned and s.status == LOADED and s.keep_alive != math.inf:
                s.expires_at = s.last_used + s.keep_alive
                self._start_reaper()
                self._cv.notify_all()

    async def ready(self, slot: ModelSlot) -> None:
        """Return once `slot` is loaded, loading it (one load per model, shared by every request
        waiting for it) within --load-timeout; 503 on timeout or no room, 500 if loading fails."""
        fut = self._start_load(slot)
        if fut is None:
            return
        timeout = self.config.load_timeout
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), timeout)
        except asyncio.TimeoutError:
            raise unavailable(f"model '{slot.model_name}' is still loading after {timeout:g} s "
                              "(--load-timeout); retry later", retry_after=10) from None
        except APIError:
            raise
        except Exception as e:
            raise APIError(500, f"model '{slot.model_name}' failed to load: {type(e).__name__}: {e}",
                           code="model_load_failed") from None

    def _start_load(self, slot: ModelSlot) -> concurrent.futures.Future | None:
        with self._lock:
            if slot.status == LOADED:
                return None
            fut = self._loads.get(slot.model_name)
            if fut is not None:
                return fut
            fut = concurrent.futures.Future()
            fut.set_running_or_notify_cancel()  # a waiter's timeout must not cancel the shared load
            self._loads[slot.model_name] = fut
            slot.status = LOADING
        # a short-lived thread: OpenMP's worker team of the warm-up leaves with it (edged.loader)
        threading.Thread(target=self._load, args=(slot, fut), name="edged-load", daemon=True).start()
        return fut

    def _load(self, slot: ModelSlot, fut: concurrent.futures.Future) -> None:
        name = slot.model_name
        try:
            slot.unloaded.wait()  # an unload of this model still in progress finishes first
            if slot.estimate is None:
                slot.estimate = estimate_file(slot.model_path, slot.plan_kv, self.config)
            for victim in self._make_room(slot):
                self._unload(victim, "evicted", f"to make room for {name}")
            log.info("loading %s (%s)", name, slot.estimate.describe())
            seconds = slot.load()
        except BaseException as e:
            no_room = isinstance(e, APIError)
            with self._lock:
                slot.status = UNLOADED
                self._loads.pop(name, None)
                if not no_room:
                    slot.error = f"{type(e).__name__}: {e}"
            self.metrics.model_loads.labels(name, "no_room" if no_room else "failed").inc()
            if not no_room:
                log.error("loading %s failed: %s", name, slot.error)
            fut.set_exception(e)
            return
        with self._cv:
            self._loads.pop(name, None)
            slot.last_used = time.monotonic()
            if slot.holds == 0 and slot.keep_alive != math.inf:  # a preload: expire as if used now
                slot.expires_at = slot.last_used + slot.keep_alive
                self._start_reaper()
                self._cv.notify_all()
        self.metrics.model_loads.labels(name, "ok").inc()
        self.metrics.model_load_seconds.labels(name).observe(seconds)
        log.info("loaded %s in %.1f s (%d loaded)", name, seconds, len(self.loaded()))
        fut.set_result(None)

    def preload(self, name: str) -> None:
        """Start loading a store model at startup (--preload), as a request for it would."""
        try:
            self._start_load(self.resolve(name))
        except APIError as e:
            log.error("--preload %s: %s", name, e.message)

    def load_pinned(self, slot: ModelSlot) -> None:
        """Load the model given as MODEL, at startup (blocking; no limit applies to it)."""
        self.add(slot)
        slot.status = LOADING
        try:
            seconds = slot.load()
        except BaseException as e:
            slot.status, slot.error = UNLOADED, f"{type(e).__name__}: {e}"
            self.metrics.model_loads.labels(slot.model_name, "failed").inc()
            raise
        self.add_attached(slot)
        self.metrics.model_loads.labels(slot.model_name, "ok").inc()
        self.metrics.model_load_seconds.labels(slot.model_name).observe(seconds)

    def add_attached(self, slot: ModelSlot) -> ModelSlot:
        """Register a slot whose engine already runs (its estimate taken from the live model)."""
        if slot.estimate is None:
            model = slot.engine.model
            slot.estimate = estimate(model, _file_size(slot.model_path), slot.plan_kv(model), self.config,
                                     slot.draft_bytes)
        return self.add(slot)

    # -- room ---------------------------------------------------------------------------------
    def _make_room(self, slot: ModelSlot) -> list[ModelSlot]:
        """The idle models to unload, least recently used first, so `slot` fits both limits
        (marked unloading here, under the lock); 503 with the numbers when it cannot fit."""
        need = slot.estimate.total
        limit_n, limit_mem = self.config.max_loaded_models, self.max_memory
        with self._lock:
            others = [s for s in self.slots.values() if s is not slot and s.status in (LOADED, LOADING)]
            victims: list[ModelSlot] = []
            while True:
                kept = [s for s in others if s not in victims]
                used = sum(_estimated(s) for s in kept)
                count_over = bool(limit_n) and len(kept) + 1 > limit_n
                memory_over = limit_mem is not None and used + need > limit_mem
                if not (count_over or memory_over):
                    break
                idle = [s for s in kept if s.status == LOADED and s.idle and not s.pinned]
                if not idle or (limit_mem is not None and need > limit_mem):
                    raise self._no_room(slot, kept, used, count_over, memory_over)
                victims.append(min(idle, key=lambda s: s.last_used))
            for v in victims:
                v.status = UNLOADING
        return victims

    def _no_room(self, slot, kept, used, count_over, memory_over) -> APIError:
        busy = ", ".join(f"{s.model_name} ({_busy(s)})" for s in kept) or "none"
        if memory_over:
            limit = self.max_memory
            free = max(0, limit - used)
            why = (f"it needs {slot.estimate.describe()} and {fmt_bytes(free)} of the "
                   f"{fmt_bytes(limit)} --max-memory is free")
            if slot.estimate.total > limit:
                why = f"it needs {slot.estimate.describe()}, more than --max-memory {fmt_bytes(limit)}"
        else:
            why = f"--max-loaded-models {self.config.max_loaded_models} are loaded"
        return unavailable(f"cannot load model '{slot.model_name}': {why}; none of the loaded "
                           f"models can be unloaded: {busy}", retry_after=5)

    # -- unloading ----------------------------------------------------------------------------
    def _unload(self, slot: ModelSlot, reason: str, why: str = "") -> None:
        """Unload a slot already marked UNLOADING (its engine stops, its memory is returned)."""
        t0 = time.monotonic()
        slot.unload()
        self.metrics.model_unloads.labels(slot.model_name, reason).inc()
        log.info("unloaded %s (%s%s) in %.2f s", slot.model_name, reason, f", {why}" if why else "",
                 time.monotonic() - t0)
        with self._lock:
            if slot.status == UNLOADING:  # not re-requested meanwhile
                slot.status = UNLOADED

    def _start_reaper(self) -> None:
        """Start the expiry thread on first need (called with the lock held)."""
        if self._reaper is None and not self._stopping:
            self._reaper = threading.Thread(target=self._reap, name="edged-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        """Unload idle models whose keep_alive ran out, sleeping until the next expiry."""
        while True:
            with self._cv:
                if self._stopping:
                    return
                now = time.monotonic()
                candidates = [s for s in self.slots.values() if s.status == LOADED and not s.pinned
                              and s.idle and s.expires_at is not None]
                due = [s for s in candidates if s.expires_at <= now]
                if not due:
                    nxt = min((s.expires_at for s in candidates), default=None)
                    self._cv.wait(None if nxt is None else max(0.01, nxt - now))
                    continue
                for s in due:
                    s.status = UNLOADING
            for s in due:
                self._unload(s, "expired", f"keep_alive {s.keep_alive:g} s")

    def shutdown(self) -> None:
        """Stop every engine (the process is exiting)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for s in list(self.slots.values()):
            if s.engine is not None:
                s.engine.stop()


def store_aliases(name: str) -> tuple[str, ...]:
    """Other ids of a store entry: "name" for "name:latest"."""
    return (name[: -len(":latest")],) if name.endswith(":latest") else ()


def _estimated(slot: ModelSlot) -> int:
    return slot.estimate.total if slot.estimate is not None else 0


def _busy(slot: ModelSlot) -> str:
    if slot.status == LOADING:
        return "loading"
    if slot.pinned:
        return "pinned"
    return f"{slot.holds} request{'s' if slot.holds != 1 else ''}"


def _file_size(path) -> int:
    import os

    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0
