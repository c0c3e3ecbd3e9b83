"""The starlette app: routes only validate, enqueue and stream; the engine thread does the work."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edged.server import schemas
from edged.server.errors import APIError, error_body, error_response, sse_error_event
from edged.server.generation import Generation, until_disconnect
from edged.server.lifecycle import FAILED, READY, ServerState
from edged.server.metrics import CONTENT_TYPE
from edged.server.responses import (SSE_DONE, CompletionLogprobs, SSEResponse, TokenText,
                                    chat_logprob_entry, finish_reason, is_logged, sse, usage)
from edged.server.security import BodyTooLarge, SecurityMiddleware

log = logging.getLogger("edged.server")

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


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


# -- health, models, metrics -----------------------------------------------------------------------

async def health(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    if state.status == READY:
        return JSONResponse({"status": "ok"})
    body = {"status": state.status}
    if state.status == FAILED:
        body["error"] = state.error
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})


def _model_card(state: ServerState) -> dict:
    card = {"id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "edged"}
    if state.engine is not None:
        card["max_model_len"] = state.max_len
    return card


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    mid = request.path_params["model_id"]
    _check_model(state, mid)
    return JSONResponse(_model_card(state))


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


# -- tokenize ---------------------------------------------------------------------------------------

def _ready_tokenizer(state: ServerState):
    if state.tokenizer is None:
        state.check_serving()
    return state.tokenizer


async def tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    tok = _ready_tokenizer(state)
    req = schemas.parse_tokenize(await _json_body(request))
    ids = await run_in_threadpool(tok.encode, req.content, req.add_special, True)
    if not req.with_pieces:
        return JSONResponse({"tokens": ids})
    tt = TokenText(tok)
    return JSONResponse({"tokens": [{"id": i, "piece": tt.get(i)[0]} for i in ids]})


async def detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    tok = _ready_tokenizer(state)
    req = schemas.parse_detokenize(await _json_body(request), tok.vocab_size)
    return JSONResponse({"content": tok.decode(req.tokens)})


# -- generation -------------------------------------------------------------------------------------

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


def _submit(state: ServerState, rid: str, prompts: list, req, default_max_tokens) -> Generation:
    """A Generation with every choice of `req` queued (closed again if queueing fails)."""
    gen = Generation(state, rid)
    try:
        gen.submit(prompts, req.params, req.n, req.max_tokens, default_max_tokens, req.top_logprobs)
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


async def chat_completions(request: Request) -> Response:
    state, req, model = await _prepare(request, schemas.parse_chat)
    tok = state.tokenizer

    def render_and_encode():
        text = state.chat.render(req.messages, add_generation_prompt=True, tools=req.tools)
        return tok.encode(text, add_special=True, parse_special=True)

    ids = await run_in_threadpool(render_and_encode)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    gen = _submit(state, rid, [ids], req, lambda p: state.max_len - p)
    head = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model}
    tt = TokenText(tok)

    def choices():
        out = []
        for c in gen.choices:
            text = "".join(d.text for d in c.deltas)
            lp = None
            if req.top_logprobs is not None:
                lp = {"content": [chat_logprob_entry(d, tt) for d in c.deltas if is_logged(d, tok)]}
            out.append({"index": c.index, "message": {"role": "assistant", "content": text},
                        "logprobs": lp, "finish_reason": finish_reason(c.finish_reason)})
        return out

    chunk_head = {**head, "object": "chat.completion.chunk"}
    events = _chat_events(gen, req, chunk_head, len(ids), tt) if req.stream else None
    return await _respond(request, gen, events, head, choices, len(ids))


async def _chat_events(gen: Generation, req, head: dict, n_prompt: int, tt):
    yield _chunk(head, req, [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None} for c in gen.choices])
    async for c, d in gen.events():
        lp = None
        if req.top_logprobs is not None and is_logged(d, tt.tok):
            lp = {"content": [chat_logprob_entry(d, tt)]}
        if d.finish_reason == "error":
            yield sse_error_event(APIError(500, f"generation failed: {d.error}", code="engine_error"))
            continue
        if not d.text and lp is None and d.finish_reason is None:
            continue  # UTF-8 or stop-string look-ahead held the text back
        delta = {"content": d.text} if d.text or lp is not None else {}
        yield _chunk(head, req, [{"index": c.index, "delta": delta, "logprobs": lp,
                                  "finish_reason": finish_reason(d.finish_reason)}])
    if req.include_usage:
        yield _chunk(head, req, [], usage(n_prompt, gen.usage_completion_tokens))
    yield SSE_DONE


async def completions(request: Request) -> Response:
    state, req, model = await _prepare(request, schemas.parse_completion)
    tok = state.tokenizer

    def encode_all():
        return [tok.encode(p, add_special=True, parse_special=True) if isinstance(p, str) else p
                for p in req.prompts]

    prompts = await run_in_threadpool(encode_all)
    echoes = [""] * len(prompts)
    if req.echo:
        echoes = [p if isinstance(p, str) else tok.decode(p) for p in req.prompts]
    rid = f"cmpl-{uuid.uuid4().hex}"
    gen = _submit(state, rid, prompts, req,
                  lambda p: min(COMPLETIONS_DEFAULT_MAX_TOKENS, state.max_len - p))
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
    tt = TokenText(tok)
    n_prompt = sum(len(p) for p in prompts)

    def choices():
        out = []
        for c in gen.choices:
            text = echoes[c.index // req.n]
            lp = CompletionLogprobs() if req.top_logprobs is not None else None
            for d in c.deltas:
                if lp is not None and is_logged(d, tok):
                    lp.add(d, tt, len(text))
                text += d.text
            out.append({"index": c.index, "text": text,
                        "logprobs": lp.to_dict() if lp is not None else None,
                        "finish_reason": finish_reason(c.finish_reason)})
        return out

    events = _completion_events(gen, req, head, n_prompt, echoes, tt) if req.stream else None
    return await _respond(request, gen, events, head, choices, n_prompt)


async def _completion_events(gen: Generation, req, head: dict, n_prompt: int, echoes, tt):
    sent = {c.index: 0 for c in gen.choices}  # characters sent per choice (for text_offset)
    if req.echo:
        for c in gen.choices:
            e = echoes[c.index // req.n]
            sent[c.index] = len(e)
            yield _chunk(head, req, [{"index": c.index, "text": e, "logprobs": None, "finish_reason": None}])
    async for c, d in gen.events():
        if d.finish_reason == "error":
            yield sse_error_event(APIError(500, f"generation failed: {d.error}", code="engine_error"))
            continue
        lp = None
        if req.top_logprobs is not None and is_logged(d, tt.tok):
            clp = CompletionLogprobs()
            clp.add(d, tt, sent[c.index])
            lp = clp.to_dict()
        if not d.text and lp is None and d.finish_reason is None:
            continue
        sent[c.index] += len(d.text)
        yield _chunk(head, req, [{"index": c.index, "text": d.text, "logprobs": lp,
                                  "finish_reason": finish_reason(d.finish_reason)}])
    if req.include_usage:
        yield _chunk(head, req, [], usage(n_prompt, gen.usage_completion_tokens))
    yield SSE_DONE


# -- app --------------------------------------------------------------------------------------------

async def _http_exception(request: Request, exc: HTTPException) -> Response:
    msg = {404: f"no route {request.method} {request.url.path}",
           405: f"method {request.method} not allowed on {request.url.path}"}.get(
        exc.status_code, str(exc.detail))
    return JSONResponse(error_body(exc.status_code, msg, code="not_found" if exc.status_code == 404
                                   else None), status_code=exc.status_code)


async def _mapped_exception(request: Request, exc: Exception) -> Response:
    if isinstance(exc, BodyTooLarge):
        exc = APIError(413, str(exc), code="body_too_large")
    return error_response(exc)


# Client errors are answered by these handlers; anything else reaches `Exception` (a logged 500).
_HANDLERS = {HTTPException: _http_exception, APIError: _mapped_exception,
             BodyTooLarge: _mapped_exception, ValueError: _mapped_exception,
             TypeError: _mapped_exception, Exception: _mapped_exception}


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
]
_ROUTE_LABELS = frozenset(r.path for r in ROUTES if "{" not in r.path)


class _CountRequests:
    """Counts responses by route and status for /metrics (unknown paths as 'other')."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in _ROUTE_LABELS else "other"

        async def counting_send(msg):
            if msg["type"] == "http.response.start":
                self.state.metrics.requests.labels(route, str(msg["status"])).inc()
            await send(msg)

        await self.app(scope, receive, counting_send)


def create_app(state: ServerState, *, load_in_background: bool = True) -> Starlette:
    """The ASGI app over a ServerState. With load_in_background, startup loads the model in a
    thread (the server answers /health 503 meanwhile); otherwise call state.attach() yourself."""
    c = state.config
    middleware = [Middleware(_CountRequests, state=state),
                  Middleware(SecurityMiddleware, config=c)]
    if c.cors_origins:
        # inside the Host check; preflight OPTIONS passes the key check (browsers send no key)
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(c.cors_origins),
                                     allow_methods=["GET", "POST", "OPTIONS"],
                                     allow_headers=["authorization", "content-type", "x-api-key"]))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if load_in_background and state.engine is None:
            threading.Thread(target=state.load, name="edged-load", daemon=True).start()
        try:
            yield
        finally:
            state.shutdown()

    app = Starlette(routes=ROUTES, middleware=middleware, lifespan=lifespan,
                    exception_handlers=_HANDLERS)
    app.state.edged = state
    return app
