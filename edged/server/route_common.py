"""What the generation routes share: the JSON body, the model check, submitting a request's
choices (with their grammar constraints) and answering in one JSON object or as SSE."""

from __future__ import annotations

import asyncio
import json
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edged.server.errors import APIError
from edged.server.generation import Generation, until_disconnect
from edged.server.lifecycle import ServerState
from edged.server.model_slot import ModelSlot
from edged.server.responses import SSEResponse, sse, usage
from edged.server.schemas import requested_model
from edged.server.security import BodyTimeout, BodyTooLarge


async def _json_body(request: Request):
    try:
        raw = await request.body()
    except BodyTooLarge as e:
        raise APIError(413, str(e), code="body_too_large") from None
    except BodyTimeout as e:  # the rest of the body may still trickle in: close the connection
        raise APIError(408, str(e), code="body_timeout", headers={"Connection": "close"}) from None
    if not raw:
        raise APIError(400, "request body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None


HOLDS = "edged.holds"  # scope key: the Holds a request took (released by app._ReleaseHolds)


async def model_slot(request: Request, model: str | None) -> ModelSlot:
    """The loaded slot for a request's `model` (None: the default), held until the response
    ends; waits for the model to load (--load-timeout). 503 when the server does not serve,
    404 naming the available models for an unknown one."""
    state: ServerState = request.app.state.edged
    state.check_serving()
    slot = state.models.resolve(model)
    hold = state.models.hold(slot)
    request.scope.setdefault(HOLDS, []).append(hold)
    await state.models.ready(slot)
    return slot


def set_keep_alive(request: Request, keep_alive: float | None) -> None:
    """The request's keep_alive (seconds; None: --keep-alive) for the models it holds."""
    for hold in request.scope.get(HOLDS, ()):
        hold.keep_alive = keep_alive


async def _prepare(request: Request, parse):
    """Shared by chat and completions: 503 if not serving, the model (loaded, and held for the
    request), parse. Returns (slot, request, model id)."""
    request.app.state.edged.check_serving()
    body = await _json_body(request)
    slot = await model_slot(request, requested_model(body))
    req = parse(body, slot.tokenizer.vocab_size)
    set_keep_alive(request, req.keep_alive)
    return slot, req, slot.model_name


def _error_finish(gen: Generation):
    """The first engine error among finished choices, if any."""
    for c in gen.choices:
        for d in c.deltas:
            if d.finish_reason == "error":
                return d.error or "generation failed"
    return None


async def _collected(request: Request, gen: Generation) -> bool:
    """Wait until every choice finished: False when the client left first, 500 on an engine error."""
    ok, _ = await until_disconnect(gen.collect(), request.receive)
    if not ok:
        return False
    err = _error_finish(gen)
    if err is not None:
        raise APIError(500, f"generation failed: {err}", code="engine_error")
    return True


async def _constraints(slot: ModelSlot, constraint, count: int, options=None) -> list | None:
    """One RequestConstraint per choice, or None. The grammar compiles (and the model's llguidance
    tokenizer is built, the first time) off the event loop; a bad grammar is a 400 naming its field.
    options(grammars) -> (constraint, request_constraint keywords) when given."""
    if constraint is None and options is None:
        return None

    def build():
        grammars = slot.grammars()
        c, kw = options(grammars) if options is not None else (constraint, {})
        if c is None:
            return None
        first = grammars.request_constraint(c, **kw)
        return [first] + [first.copy() for _ in range(count - 1)]

    return await asyncio.to_thread(build)


async def _submit(slot: ModelSlot, rid: str, prompts: list, req, default_max_tokens,
                  options=None) -> Generation:
    """A Generation with every choice of `req` queued (closed again if queueing fails)."""
    constraints = await _constraints(slot, req.constraint, len(prompts) * req.n, options)
    gen = Generation(slot, rid)
    try:
        gen.submit(prompts, req.params, req.n, req.max_tokens, default_max_tokens, req.top_logprobs,
                   constraints)
    except BaseException:
        gen.close()
        raise
    return gen


async def _respond(request: Request, gen: Generation, events, head: dict, choices_of,
                   n_prompt: int) -> Response:
    """SSE of `events` when streaming (events is not None), else one JSON object: `head`, the
    choices_of() once every choice finished, and usage; 499 when the client left first."""
    if events is not None:
        return SSEResponse(events, gen.close)
    try:
        if not await _collected(request, gen):
            return Response(status_code=499)
        choices = choices_of()  # first: it may add to head (chat's prompt_logprobs)
        return JSONResponse({**head, "choices": choices,
                             "usage": usage(n_prompt, gen.usage_completion_tokens)})
    finally:
        gen.close()


def _chunk(head: dict, req, choices: list, use=None) -> bytes:
    """One streamed chunk: `head`, the choices and, when the client asked for usage, `use`."""
    obj = {**head, "choices": choices}
    if req.include_usage:
        obj["usage"] = use
    return sse(obj)


