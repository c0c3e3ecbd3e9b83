"""The starlette app: routes only validate, enqueue and stream; the engine thread does the work."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edged.server import schemas
from edged.server.anthropic_errors import error_response as anthropic_error_response, is_anthropic_path
from edged.server.anthropic_routes import anthropic_routes
from edged.server.chat_route import chat_completions
from edged.server.embeddings_route import embeddings
from edged.server.errors import APIError, error_body, error_response, sse_error_event
from edged.server.generation import Generation
from edged.server.lifecycle import FAILED, READY, ServerState
from edged.server.metrics import CONTENT_TYPE
from edged.server import openapi_shapes as shapes
from edged.server.openapi import openapi_json
from edged.server.ollama_routes import ollama_routes
from edged.server.responses import (SSE_DONE, CompletionLogprobs, TokenText, finish_reason, is_logged,
                                    prompt_scores, usage, vllm_prompt_logprobs)
from edged.server.responses_api_route import responses_api_routes
from edged.server.route_common import (HOLDS, _chunk, _json_body, _prepare, _respond, _submit,
                                       model_slot)
from edged.server.schemas import requested_model
from edged.server.security import BodyTooLarge, SecurityMiddleware
from edged.server.spec import Operation, operation

log = logging.getLogger("edged.server")

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


# -- health, models, metrics -----------------------------------------------------------------------

@operation(Operation("Liveness: ok once the server serves", response=shapes.HEALTH, public=True,
                     tag="server", responses={"503": {"description": "loading or failed (see Retry-After)",
                                                      "content": {"application/json": {"schema": shapes.HEALTH}}}}))
async def health(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    if state.status == READY:
        return JSONResponse({"status": "ok"})
    body = {"status": state.status}
    if state.status == FAILED:
        body["error"] = state.error
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})


@operation(Operation("Every servable model and its status", response=shapes.MODEL_LIST))
async def list_models(request: Request) -> Response:
    """Every servable model, with its status (loaded, loading, unloaded)."""
    state: ServerState = request.app.state.edged
    return JSONResponse({"object": "list",
                         "data": [s.card(state.created) for s in state.models.listed()]})


@operation(Operation("One model", response=shapes.MODEL_CARD, statuses=(404,)))
async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    slot = state.models.resolve(request.path_params["model_id"])
    return JSONResponse(slot.card(state.created))


@operation(Operation("Prometheus metrics", media="text/plain", tag="server"))
async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.edged
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


# -- tokenize ---------------------------------------------------------------------------------------

async def _tokenizer(request: Request, body):
    """The tokenizer of the body's `model` (the default one when absent), loaded and held."""
    return (await model_slot(request, requested_model(body))).tokenizer


@operation(Operation("Text to token ids", body=schemas.TOKENIZE, response=shapes.TOKENS,
                     statuses=(404, 503), tag="llama-server"))
async def tokenize(request: Request) -> Response:
    body = await _json_body(request)
    tok = await _tokenizer(request, body)
    req = schemas.parse_tokenize(body)
    ids = await run_in_threadpool(tok.encode, req.content, req.add_special, True)
    if not req.with_pieces:
        return JSONResponse({"tokens": ids})
    tt = TokenText(tok)
    return JSONResponse({"tokens": [{"id": i, "piece": tt.get(i)[0]} for i in ids]})


@operation(Operation("Token ids to text", body=schemas.DETOKENIZE, response=shapes.CONTENT,
                     statuses=(404, 503), tag="llama-server"))
async def detokenize(request: Request) -> Response:
    body = await _json_body(request)
    tok = await _tokenizer(request, body)
    req = schemas.parse_detokenize(body, tok.vocab_size)
    return JSONResponse({"content": tok.decode(req.tokens)})


# -- generation -------------------------------------------------------------------------------------

@operation(Operation("A text completion", body=schemas.COMPLETION, response=shapes.TEXT_COMPLETION,
                     stream_media="text/event-stream", stream_item=shapes.TEXT_CHUNK,
                     statuses=(404, 500, 503)))
async def completions(request: Request) -> Response:
    slot, req, model = await _prepare(request, schemas.parse_completion)
    tok = slot.tokenizer

    def encode_all():
        return [tok.encode(p, add_special=True, parse_special=True) if isinstance(p, str) else p
                for p in req.prompts]

    prompts = await run_in_threadpool(encode_all)
    echoes = [""] * len(prompts)
    if req.echo:
        echoes = [p if isinstance(p, str) else tok.decode(p) for p in req.prompts]
    rid = f"cmpl-{uuid.uuid4().hex}"
    gen = await _submit(slot, rid, prompts, req,
                        lambda p: min(COMPLETIONS_DEFAULT_MAX_TOKENS, slot.max_len - p))
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
    tt = TokenText(tok)
    n_prompt = sum(len(p) for p in prompts)

    def choices():
        out = []
        for c in gen.choices:
            p = c.index // req.n
            text = echoes[p]
            lp = CompletionLogprobs() if req.top_logprobs is not None else None
            scores = prompt_scores(c.deltas)
            if lp is not None and req.echo:  # the prompt's tokens first (OpenAI's legacy echo)
                lp.add_prompt(prompts[p], scores, tt, req.top_logprobs)
            for d in c.deltas:
                if lp is not None and is_logged(d, tok):
                    lp.add(d, tt, len(text))
                text += d.text
            choice = {"index": c.index, "text": text,
                      "logprobs": lp.to_dict() if lp is not None else None,
                      "finish_reason": finish_reason(c.finish_reason)}
            if req.prompt_logprobs is not None:  # vLLM's field
                choice["prompt_logprobs"] = vllm_prompt_logprobs(prompts[p], scores, tt, req.prompt_logprobs)
            out.append(choice)
        return out

    events = _completion_events(gen, req, head, n_prompt, prompts, echoes, tt) if req.stream else None
    return await _respond(request, gen, events, head, choices, n_prompt)


async def _completion_events(gen: Generation, req, head: dict, n_prompt: int, prompts, echoes, tt):
    sent = {c.index: 0 for c in gen.choices}  # characters sent per choice (for text_offset)

    def echo_chunk(c, scores) -> bytes:
        e = echoes[c.index // req.n]
        lp = None
        if scores is not None:
            clp = CompletionLogprobs()
            clp.add_prompt(prompts[c.index // req.n], scores, tt, req.top_logprobs)
            lp = clp.to_dict()
        sent[c.index] = len(e)
        return _chunk(head, req, [{"index": c.index, "text": e, "logprobs": lp, "finish_reason": None}])

    # echo with logprobs waits for the prompt's scores (the first delta after the prefill)
    scored_echo = req.echo and req.top_logprobs is not None
    if req.echo and not scored_echo:
        for c in gen.choices:
            yield echo_chunk(c, None)
    async for c, d in gen.events():
        if d.finish_reason == "error":
            yield sse_error_event(APIError(500, f"generation failed: {d.error}", code="engine_error"))
            continue
        if scored_echo and d.prompt_logprobs is not None:
            yield echo_chunk(c, d.prompt_logprobs)
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
    if is_anthropic_path(request.url.path):  # /v1/messages/batches, GET /v1/messages
        return anthropic_error_response(APIError(exc.status_code, msg))
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
    Route("/v1/embeddings", embeddings, methods=["POST"]),  # edged/server/embeddings_route.py
    *responses_api_routes(),  # the Responses API, /v1/responses (edged/server/responses_api_route.py)
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    *ollama_routes(),  # Ollama's API, /api/* (edged/server/ollama_routes.py)
    *anthropic_routes(),  # Anthropic's Messages API, /v1/messages* (edged/server/anthropic_routes.py)
]
_ROUTE_LABELS = frozenset(r.path for r in ROUTES if "{" not in r.path)


class _ReleaseHolds:
    """Releases the models a request held (route_common.model_slot) once its response, streamed
    or not, is over: only then may the model expire or be evicted."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        finally:
            for hold in scope.pop(HOLDS, ()):
                self.state.models.release(hold)


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
    """The ASGI app over a ServerState. With load_in_background, startup runs state.load() in a
    thread (a MODEL loads while /health answers 503); otherwise call state.attach() yourself."""
    c = state.config
    middleware = [Middleware(_ReleaseHolds, state=state), Middleware(_CountRequests, state=state),
                  Middleware(SecurityMiddleware, config=c)]
    if c.cors_origins:
        # inside the Host check; preflight OPTIONS passes the key check (browsers send no key)
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(c.cors_origins),
                                     allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                                     allow_headers=["authorization", "content-type", "x-api-key"]))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if load_in_background and not state.models.slots:
            threading.Thread(target=state.load, name="edged-load", daemon=True).start()
        try:
            yield
        finally:
            state.shutdown()

    app = Starlette(routes=ROUTES, middleware=middleware, lifespan=lifespan,
                    exception_handlers=_HANDLERS)
    app.state.edged = state
    return app
