"""Per-request output streams: the engine thread pushes, a thread or an asyncio loop consumes."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field


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


@dataclass(eq=False)
class RequestStream:
    """Deltas of one request. Iterate it (blocking) in a thread, or `async for` it in the loop
    that created it (bound with `bind_loop`)."""

    request_id: str
    _q: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _aq: asyncio.Queue | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    finished: bool = False

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._aq = asyncio.Queue()

    def put(self, delta: Delta) -> None:
        """Called by the engine thread."""
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._aq.put_nowait, delta)
            except RuntimeError:  # the loop is closed: nobody listens any more
                pass
        else:
            self._q.put(delta)

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
