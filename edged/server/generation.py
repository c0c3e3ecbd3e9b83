"""One HTTP request's generations: n engine requests per prompt, merged into one event stream,
timed for the metrics, and aborted whenever the HTTP side stops listening."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from dataclasses import dataclass, field

from edged.engine.stream import Delta
from edged.sampling import SamplingParams
from edged.server.errors import bad_request
from edged.server.model_slot import ModelSlot

# deltas one choice may have queued for a client that does not read them: past this the request is
# aborted (its KV freed) instead of the queue growing for as long as the socket stays blocked
STREAM_BUFFER_PER_CHOICE = 512


class StreamStalled(Exception):
    """The client stopped reading: the stream buffer filled, or a send waited past
    --stream-stall-timeout. The generation is aborted and the connection closed."""


_STALLED = object()  # queued after the abort, so a waiting events() wakes up and raises

@dataclass
class Choice:
    """One engine request = one OpenAI choice."""

    index: int
    request_id: str
    prompt_ids: list[int]
    stream: object = None
    finished: bool = False
    finish_reason: str | None = None
    num_output_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    deltas: list[Delta] = field(default_factory=list)


def choice_params(base: SamplingParams, k: int, max_tokens: int, top_logprobs: int | None) -> SamplingParams:
    """Params of choice k: its own seed (seed + k) so n seeded choices differ yet repeat."""
    seed = None if base.seed is None else (base.seed + k) % 2**64
    return dataclasses.replace(base, seed=seed, max_tokens=max_tokens, logprobs=top_logprobs)


class Generation:
    """Submits every choice, yields (choice, delta) as they arrive, aborts the rest on close().

    Use as: `gen.submit(...)` then `async for choice, delta in gen.events()`, always followed by
    `gen.close()` (in a finally) so a vanished client frees its KV blocks at the next step.
    """

    def __init__(self, slot: ModelSlot, request_id: str):
        self.slot = slot
        self.request_id = request_id
        self.choices: list[Choice] = []
        self.arrival = time.monotonic()
        self._queue: asyncio.Queue | None = None
        self._reserved = 0
        self._closed = False
        self.stalled = False
        self._bound = 0  # queued deltas allowed: STREAM_BUFFER_PER_CHOICE x choices

    def submit(self, prompts: list[list[int]], base: SamplingParams, n: int,
               max_tokens: int | None, default_max_tokens, top_logprobs: int | None,
               constraints: list | None = None) -> None:
        """Queue n choices per prompt (choice index = prompt index x n + k). max_tokens None means
        default_max_tokens(prompt_len); constraints: one RequestConstraint per choice, or None.
        Raises APIError 400/503 before anything runs."""
        st = self.slot
        limit = st.max_len
        for ids in prompts:
            mt = max_tokens if max_tokens is not None else default_max_tokens(len(ids))
            if len(ids) >= limit or len(ids) + mt > limit:
                raise bad_request(
                    f"this model's context holds {limit} tokens; the prompt has {len(ids)} and "
                    f"{mt} more were requested", "max_tokens" if max_tokens else "messages",
                    code="context_length_exceeded")
        st.acquire(len(prompts) * n)
        self._reserved = len(prompts) * n
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._bound = STREAM_BUFFER_PER_CHOICE * len(prompts) * n
        try:
            for p, ids in enumerate(prompts):
                mt = max_tokens if max_tokens is not None else default_max_tokens(len(ids))
                for k in range(n):
                    idx = p * n + k
                    c = Choice(idx, f"{self.request_id}-{idx}", ids)
                    params = choice_params(base, idx, mt, top_logprobs)
                    # deltas arrive through _on_delta on this loop: no task or queue per choice
                    c.stream = st.engine.add_request(
                        ids, params, request_id=c.request_id, loop=loop,
                        sink=functools.partial(self._on_delta, c),
                        constraint=constraints[idx] if constraints else None)
                    st.live_ids.add(c.request_id)
                    self.choices.append(c)
        except BaseException:
            self.close()
            raise

    def _on_delta(self, c: Choice, d: Delta) -> None:
        """On the loop, for each delta of choice c (the engine batches a step's deltas into one
        wake-up of the loop)."""
        if self._closed or c.finished:  # closed, or aborted by close(): nobody reads these
            return
        m = self.slot.metrics
        now = time.monotonic()
        if d.token_id is not None:
            if c.first_token_at is None:
                c.first_token_at = now
                m.ttft.observe(now - self.arrival)
            else:
                m.itl.observe(now - c.last_token_at)
            c.last_token_at = now
        c.num_output_tokens = d.num_output_tokens
        if d.finish_reason is not None:
            self._finish(c, d.finish_reason)
            m.e2e.observe(now - self.arrival)
        if self._queue.qsize() >= self._bound:
            self._stall()
            return
        self._queue.put_nowait((c, d))
        m.stream_buffered.inc()

    def _stall(self) -> None:
        """The buffer is full: nobody reads; abort everything and wake events() to raise."""
        self.stalled = True
        self.close()
        self._queue.put_nowait((None, _STALLED))

    def _finish(self, c: Choice, reason: str) -> None:
        if not c.finished:
            c.finished = True
            c.finish_reason = reason
            self.slot.live_ids.discard(c.request_id)
            self.slot.metrics.finished.labels(reason).inc()
            self.slot.release(1)
            self._reserved -= 1

    async def events(self):
        """(choice, delta) pairs until every choice has finished."""
        remaining = len(self.choices)
        while remaining:
            c, d = await self._queue.get()
            if d is _STALLED:
                raise StreamStalled(f"{STREAM_BUFFER_PER_CHOICE} deltas per choice were queued and "
                                    "not read")
            self.slot.metrics.stream_buffered.dec()
            if d.finish_reason is not None:
                remaining -= 1
            yield c, d

    async def collect(self) -> list[Choice]:
        """Wait for every choice; their deltas are kept on each Choice."""
        async for c, d in self.events():
            c.deltas.append(d)
        return self.choices

    def close(self) -> None:
        """Abort what is still running (a no-op once everything finished). Idempotent."""
        for c in self.choices:
            if not c.finished:
                self.slot.engine.abort(c.request_id)
                self._finish(c, "abort")
        self._closed = True
        self._drop_queued()
        if self._reserved > 0:  # reserved but never submitted (add_request raised)
            self.slot.release(self._reserved)
            self._reserved = 0

    def _drop_queued(self) -> None:
        """Forget the deltas nobody will read (the buffer gauge counts only live streams')."""
        q, dropped = self._queue, 0
        while q is not None and not q.empty():
            dropped += q.get_nowait()[1] is not _STALLED
        if dropped:
            self.slot.metrics.stream_buffered.dec(dropped)

    @property
    def usage_completion_tokens(self) -> int:
        return sum(c.num_output_tokens for c in self.choices)


async def wait_disconnect(receive) -> None:
    """Returns when the client closes the connection (the request body was already read)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def until_disconnect(coro, receive):
    """Run coro; returns (True, result), or (False, None) if the client disconnects first."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return True, work.result()
        return False, None
    finally:
        for t in (work, watch):
            if not t.done():
                t.cancel()
