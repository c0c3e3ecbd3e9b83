"""OpenAI response objects: chat and completion bodies, stream chunks, logprobs, usage, SSE."""

from __future__ import annotations

import asyncio
import json
import logging

from edged.engine.stream import Delta
from edged.server.generation import StreamStalled, wait_disconnect

log = logging.getLogger("edged.server")
DEFAULT_STALL_TIMEOUT = 30.0  # an app without edged's state (ServerConfig.stream_stall_timeout)

# engine finish reasons OpenAI clients know; "abort" only reaches a client on a drain timeout
_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


class TokenText:
    """Token id -> the strings and bytes OpenAI's logprobs show (cached per id)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        r = self._cache.get(token_id)
        if r is None:
            b = self.tok.token_bytes(token_id, False)
            r = (b.decode("utf-8", errors="replace"), list(b))
            if len(self._cache) < 65536:
                self._cache[token_id] = r
        return r


def is_logged(delta: Delta, tokenizer) -> bool:
    """Whether a delta's token belongs in logprobs (not the end-of-generation token)."""
    if delta.token_id is None or delta.logprob is None:
        return False
    return not (delta.finish_reason == "stop" and tokenizer.is_eog(delta.token_id))


def chat_logprob_entry(delta: Delta, tt: TokenText) -> dict:
    s, b = tt.get(delta.token_id)
    top = []
    for tid, lp in delta.top_logprobs or ():
        ts, tb = tt.get(tid)
        top.append({"token": ts, "logprob": lp, "bytes": tb})
    return {"token": s, "logprob": delta.logprob, "bytes": b, "top_logprobs": top}


class CompletionLogprobs:
    """The legacy completions logprobs object, built token by token."""

    def __init__(self, offset: int = 0):
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.top_logprobs: list[dict] = []
        self.text_offset: list[int] = []
        self.offset = offset

    def add(self, delta: Delta, tt: TokenText, text_before: int) -> None:
        s, _ = tt.get(delta.token_id)
        self.tokens.append(s)
        self.token_logprobs.append(delta.logprob)
        self.top_logprobs.append({tt.get(t)[0]: lp for t, lp in delta.top_logprobs or ()})
        self.text_offset.append(self.offset + text_before)

    def add_prompt(self, prompt_ids: list[int], entries: list, tt: TokenText, k: int) -> None:
        """The echoed prompt's tokens (edged.engine.prompt_logprobs entries, the first None): its
        token_logprobs and top_logprobs start with null, as OpenAI's legacy API."""
        at = self.offset
        for tid, e in zip(prompt_ids, entries):
            s, _ = tt.get(tid)
            self.tokens.append(s)
            self.token_logprobs.append(None if e is None else e.logprob)
            self.top_logprobs.append(None if e is None else {tt.get(t)[0]: lp for t, lp in e.top[:k]})
            self.text_offset.append(at)
            # offsets count the echoed text, where special tokens (BOS) show no characters
            at += len(tt.tok.token_bytes(tid).decode("utf-8", errors="replace"))

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}


def prompt_scores(deltas) -> list | None:
    """The prompt logprobs one choice's deltas carried (the first delta after its prefill)."""
    return next((d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None)


def vllm_prompt_logprobs(prompt_ids: list[int], entries: list | None, tt: TokenText, k: int) -> list | None:
    """vLLM's prompt_logprobs: per prompt token null (the first) or {token id: {logprob, rank,
    decoded_token}} holding the prompt token first, then the k most likely."""
    if entries is None:
        return None
    out: list = []
    for tid, e in zip(prompt_ids, entries):
        if e is None:
            out.append(None)
            continue
        d = {str(tid): {"logprob": e.logprob, "rank": e.rank, "decoded_token": tt.get(tid)[0]}}
        for rank, (t, lp) in enumerate(e.top[:k], 1):
            d.setdefault(str(t), {"logprob": lp, "rank": rank, "decoded_token": tt.get(t)[0]})
        out.append(d)
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(reason: str | None) -> str | None:
    return None if reason is None else _FINISH.get(reason, reason)


def sse(obj) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class SSEResponse:
    """An ASGI response streaming `events` (an async iterator of bytes) as text/event-stream.

    A watcher task reads `receive` concurrently: when the client disconnects, the sender is
    cancelled at once (even while a request is still queued and nothing is being sent), and
    `on_close` runs in every case, aborting whatever is still generating. A client that stops
    reading (one send blocked past --stream-stall-timeout, or the generation's buffer full) has
    its stream aborted and its connection closed: the response is left incomplete.
    """

    def __init__(self, events, on_close):
        self.events = events
        self.on_close = on_close

    async def _send_all(self, send, stall_timeout: float) -> None:
        async def timed(msg):
            try:  # uvicorn's send waits while the socket's buffer is full
                await asyncio.wait_for(send(msg), stall_timeout)
            except asyncio.TimeoutError:
                raise StreamStalled(f"a send waited over {stall_timeout:g} s "
                                    "(--stream-stall-timeout)") from None

        async for chunk in self.events:
            await timed({"type": "http.response.body", "body": chunk, "more_body": True})
        await timed({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            state = getattr(getattr(scope.get("app"), "state", None), "edged", None)
            stall = state.config.stream_stall_timeout if state is not None else DEFAULT_STALL_TIMEOUT
            sender = asyncio.ensure_future(self._send_all(send, stall))
            watcher = asyncio.ensure_future(wait_disconnect(receive))
            done, pending = await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                # Python 3.11's wait_for can swallow a cancel that lands as its send completes: the
                # sender then streams on to a gone client. Cancel again until it has stopped.
                while not t.done():
                    t.cancel()
                    await asyncio.wait({t}, timeout=0.01)
                if not t.cancelled():
                    t.exception()  # retrieved: a late failure of a cancelled task is not news
            if sender in done and sender.exception() is not None:
                exc = sender.exception()
                if isinstance(exc, StreamStalled):  # returning incomplete closes the connection
                    log.warning("client stopped reading its stream: aborted (%s)", exc)
                    if state is not None:
                        state.metrics.streams_stalled.inc()
                elif not isinstance(exc, OSError):  # a failed send is just a gone client
                    raise exc
        finally:
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    pass
            self.on_close()
