"""Per-request output streams: the engine thread pushes, a thread or an asyncio loop consumes."""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("edged.engine")


@dataclass
class Delta:
    """One step's output for one request. `text` may be empty (UTF-8 held back, or stop-string
    look-ahead); `finish_reason` is set on the last delta: "stop", "length", "abort" or "error"."""

    token_id: int | None
    text: str
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    # on the first delta after the prompt's prefill, when asked: one PromptLogprob per prompt
    # token, None for the first (edged.engine.prompt_logprobs)
    prompt_logprobs: list | None = None
    embedding: object = None  # an embedding request's last delta: the pooled float32 [n_embd]


@dataclass(eq=False)
class RequestStream:
    """Deltas of one request. Iterate it (blocking) in a thread, or `async for` it in the loop
    that created it (bound with `bind_loop`), or give `bind_loop` a sink: a callable the loop
    calls with each delta in place of queueing it."""

    request_id: str
    _q: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _aq: asyncio.Queue | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _sink: Callable[[Delta], None] | None = None
    finished: bool = False

    def bind_loop(self, loop: asyncio.AbstractEventLoop,
                  sink: Callable[[Delta], None] | None = None) -> None:
        self._loop = loop
        self._sink = sink
        if sink is None:
            self._aq = asyncio.Queue()

    def put(self, delta: Delta) -> None:
        """Called by the engine thread (one wake-up of the loop per call; see Outbox)."""
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._deliver, delta)
            except RuntimeError:  # the loop is closed: nobody listens any more
                pass
        else:
            self._q.put(delta)

    def _deliver(self, delta: Delta) -> None:
        """On the bound loop."""
        if self._sink is not None:
            self._sink(delta)
        else:
            self._aq.put_nowait(delta)

    def __iter__(self):
        while not self.finished:
            d = self._q.get()
            self.finished = d.finish_reason is not None
            yield d

    def __aiter__(self):
        return self._agen()

    async def _agen(self):
        while not self.finished:
            d = await self._aq.get()
            self.finished = d.finish_reason is not None
            yield d


def _deliver_all(items: list[tuple[RequestStream, Delta]]) -> None:
    for stream, delta in items:
        try:
            stream._deliver(delta)
        except Exception:  # one failing consumer must not starve the others
            log.exception("delivering a delta of %s failed", stream.request_id)


class Outbox:
    """The deltas of one engine step, handed to each event loop with a single wake-up.

    The engine thread calls `put` per delta and `flush` once at the end of the step: streams bound
    to a loop get their deltas in one `call_soon_threadsafe` per loop (one self-pipe write and one
    loop iteration for all of them instead of one per stream); unbound streams get theirs at once.
    """

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, Delta]]] = {}

    def put(self, stream: RequestStream, delta: Delta) -> None:
        loop = stream._loop
        if loop is None:
            stream._q.put(delta)
        else:
            items = self._by_loop.get(loop)
            if items is None:
                self._by_loop[loop] = [(stream, delta)]
            else:
                items.append((stream, delta))

    def flush(self) -> None:
        if not self._by_loop:
            return
        pending, self._by_loop = self._by_loop, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # the loop is closed: nobody listens any more
                pass
