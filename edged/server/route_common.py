"""What the generation routes share: the JSON body, the model check, submitting a request's
choices (with their grammar constraints) and answering in one JSON object or as SSE."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edged.server.errors import APIError
from edged.server.generation import Generation, until_disconnect
from edged.server.lifecycle import ServerState
from edged.server.responses import SSEResponse, sse, usage
from edged.server.security import BodyTooLarge


async def _json_body(request: Request):
    try:
        raw = await request.body()
    except BodyTooLarge as e:
        raise APIError(413, str(e), code="body_too_large") from None
    if not raw:
        raise APIError(400, "request body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None


def _check_model(state: ServerState, model: str | None) -> str:
    """The model id to echo back; 404 for a model this server does not serve."""
    name = state.model_name
    if model is None or model in _model_names(state):
        return name
    raise APIError(404, f"model '{model}' not found; this server serves '{name}'", param="model",
                   code="model_not_found")


def _model_names(state: ServerState) -> set[str]:
    names = {state.model_name}
    if state.model_path:
        p = Path(state.model_path)
        names.update({p.name, p.stem, str(p)})
    return names


async def _prepare(request: Request, parse):
    """Shared by chat and completions: 503 if not serving, parse, model check."""
    state: ServerState = request.app.state.edged
    state.check_serving()
    body = await _json_body(request)
    req = parse(body, state.tokenizer.vocab_size)
    model = _check_model(state, req.model)
    return state, req, model


def _error_finish(gen: Generation):
    """The first engine error among finished choices, if any."""
    for c in gen.choices:
        for d in c.deltas:
            if d.finish_reason == "error":
                return d.error or "generation failed"
    return None


async def _constraints(state: ServerState, constraint, count: int, options=None) -> list | None:
    """One RequestConstraint per choice, or None. The grammar compiles (and the model's llguidance
    tokenizer is built, the first time) off the event loop; a bad grammar is a 400 naming its field.
    options(grammars) -> (constraint, request_constraint keywords) when given."""
    if constraint is None and options is None:
        return None

    def build():
        grammars = state.grammars()
        c, kw = options(grammars) if options is not None else (constraint, {})
        if c is None:
            return None
        first = grammars.request_constraint(c, **kw)
        return [first] + [first.copy() for _ in range(count - 1)]

    return await asyncio.to_thread(build)


async def _submit(state: ServerState, rid: str, prompts: list, req, default_max_tokens,
                  options=None) -> Generation:
    """A Generation with every choice of `req` queued (closed again if queueing fails)."""
    constraints = await _constraints(state, req.constraint, len(prompts) * req.n, options)
    gen = Generation(state, rid)
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
        ok, _ = await until_disconnect(gen.collect(), request.receive)
        if not ok:
            return Response(status_code=499)
        err = _error_finish(gen)
        if err is not None:
            raise APIError(500, f"generation failed: {err}", code="engine_error")
        return JSONResponse({**head, "choices": choices_of(),
                             "usage": usage(n_prompt, gen.usage_completion_tokens)})
    finally:
        gen.close()


def _chunk(head: dict, req, choices: list, use=None) -> bytes:
    """One streamed chunk: `head`, the choices and, when the client asked for usage, `use`."""
    obj = {**head, "choices": choices}
    if req.include_usage:
        obj["usage"] = use
    return sse(obj)


