"""Ollama's response pieces: timestamps, the final object's durations and counts, NDJSON lines
and the NDJSON streaming response, tool calls with object arguments, logprobs."""

from __future__ import annotations

import datetime
import json
import time

from starlette.responses import JSONResponse

from edged.server.errors import to_api_error
from edged.server.generation import Generation
from edged.server.responses import SSEResponse, TokenText, chat_logprob_entry, is_logged

NDJSON = b"application/x-ndjson"

# engine finish reasons -> Ollama's done_reason ("load" and "unload" come from the routes)
_DONE = {"stop": "stop", "length": "length", "abort": "abort"}


def timestamp(t: float | None = None) -> str:
    """RFC 3339 in UTC with microseconds, as Ollama writes created_at / expires_at."""
    d = datetime.datetime.fromtimestamp(time.time() if t is None else t, datetime.timezone.utc)
    return d.isoformat(timespec="microseconds").replace("+00:00", "Z")


def line(obj: dict) -> bytes:
    """One NDJSON line."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def error_object(exc: BaseException) -> tuple[dict, int, dict]:
    """Ollama's error body {"error": message}, the status and headers, for any exception."""
    e = to_api_error(exc)
    return {"error": e.message}, e.status, e.headers


def error_response(exc: BaseException) -> JSONResponse:
    body, status, headers = error_object(exc)
    return JSONResponse(body, status_code=status, headers=headers)


def done_reason(reason: str | None) -> str | None:
    return None if reason is None else _DONE.get(reason, reason)


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def stats(gen: Generation, started: float, load_s: float, n_prompt: int) -> dict:
    """The final object's durations (nanoseconds) and counts: prompt evaluation runs from the
    request's submission to its first token, evaluation from there to its last."""
    c = gen.choices[0]
    now = time.monotonic()
    last = c.last_token_at or now
    first = c.first_token_at or last
    return {"total_duration": _ns(now - started), "load_duration": _ns(load_s),
            "prompt_eval_count": n_prompt, "prompt_eval_duration": _ns(first - gen.arrival),
            "eval_count": c.num_output_tokens, "eval_duration": _ns(last - first)}


def tool_calls(calls) -> list[dict]:
    """edged's ToolCalls as Ollama's: arguments an object, not a JSON text."""
    out = []
    for i, c in enumerate(calls):
        args = json.loads(c.arguments) if c.arguments else {}
        if not isinstance(args, dict):
            raise ValueError(f"tool call {c.name!r} has arguments that are not a JSON object")
        out.append({"id": c.id, "function": {"index": i, "name": c.name, "arguments": args}})
    return out


def logprob_entries(deltas, tt: TokenText) -> list[dict]:
    """Ollama's logprobs: token, logprob, bytes and top_logprobs per generated token."""
    return [chat_logprob_entry(d, tt) for d in deltas if is_logged(d, tt.tok)]


class NDJSONResponse(SSEResponse):
    """SSEResponse's streaming and disconnect handling with Ollama's content type: each event is
    one JSON object on its own line."""

    async def __call__(self, scope, receive, send) -> None:
        async def send_ndjson(msg):
            if msg["type"] == "http.response.start":
                headers = [(k, v) for k, v in msg["headers"] if k != b"content-type"]
                msg = {**msg, "headers": [(b"content-type", NDJSON), *headers]}
            await send(msg)

        await super().__call__(scope, receive, send_ndjson)
