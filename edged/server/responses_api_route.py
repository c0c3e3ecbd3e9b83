"""/v1/responses (OpenAI's Responses API) on the chat pipeline: the request becomes a chat
request (responses_api_schemas), renders through the chat template and generates under the same
grammars and tool-call parsers as /v1/chat/completions; the output becomes Response items, whole
or as the API's typed SSE events. Finished responses are kept (unless `store: false`) for
GET / DELETE /v1/responses/{id} and `previous_response_id`."""

from __future__ import annotations

import functools
import itertools
import json
import time

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edged.server import chat_tools
from edged.server import openapi_shapes as shapes
from edged.server.errors import APIError, bad_request, to_api_error
from edged.server.generation import Generation
from edged.server.responses import SSEResponse
from edged.server.responses_api_output import OutputBuilder, new_id, response_object, usage
from edged.server.responses_api_schemas import RESPONSES, ResponsesRequest, parse_responses, renamed
from edged.server.responses_api_store import ResponseStore, response_store
from edged.server.route_common import _collected, _prepare, _submit
from edged.server.spec import Operation, operation

_STATUS = {"stop": "completed", "length": "incomplete"}  # engine finish -> Response status
_FINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
                "failed": "response.failed"}


class _Turn:
    """One response being made: what its Response objects repeat, and storing it when done."""

    def __init__(self, req: ResponsesRequest, rid: str, model: str, n_input: int,
                 store: ResponseStore):
        self.req, self.rid, self.model, self.n_input, self.store = req, rid, model, n_input, store
        self.created_at = int(time.time())

    def response(self, status: str, output: list, use: dict | None, error: dict | None = None) -> dict:
        return response_object(self.rid, self.created_at, self.model, self.req.echo, status,
                               output, use, error)

    def finish(self, builder: OutputBuilder, reason: str, output_tokens: int) -> dict:
        """The final Response (kept in the store unless store: false or it failed)."""
        status = _STATUS.get(reason, "failed")
        error = None
        if status == "failed":  # "abort": a drain timeout cut it off
            error = {"code": "server_error", "message": f"generation ended: {reason}"}
        final = self.response(status, builder.output,
                              usage(self.n_input, output_tokens, builder.reasoning_tokens), error)
        if self.req.store and status != "failed":
            self.store.put(final, self.req.input_items + final["output"], self.req.previous)
        return final


@operation(Operation("A response (the Responses API)", body=RESPONSES, response=shapes.RESPONSE,
                     stream_media="text/event-stream", stream_item=shapes.RESPONSE_EVENT,
                     statuses=(404, 500, 503)))
async def create_response(request: Request) -> Response:
    store = response_store(request.app)
    slot, req, model = await _prepare(request, functools.partial(parse_responses, store=store))
    chat, tok = req.chat, slot.tokenizer
    plan = chat_tools.plan_chat(slot.chat.source, chat.tool_request, slot.config.reasoning_format)

    def render_and_encode():
        text = chat_tools.render_prompt(slot.chat, plan, chat.messages, chat.tools)
        return tok.encode(text, add_special=True, parse_special=True)

    ids = await run_in_threadpool(render_and_encode)
    options = chat_tools.submit_options(plan, chat.constraint)
    turn = _Turn(req, new_id("resp"), model, len(ids), store)
    try:
        gen = await _submit(slot, turn.rid, [ids], chat, lambda p: slot.max_len - p, options)
    except Exception as e:  # the context check and grammar compilation name chat's fields
        raise renamed(to_api_error(e)) from None
    builder = OutputBuilder(plan.parser() if plan.parses else None)
    if chat.stream:
        return SSEResponse(_events(gen, turn, builder), gen.close)
    try:
        if not await _collected(request, gen):
            return Response(status_code=499)
        c = gen.choices[0]
        for d in c.deltas:
            builder.feed(d.text, 1 if d.token_id is not None else 0)
        builder.finish(incomplete=c.finish_reason != "stop")
        return JSONResponse(turn.finish(builder, c.finish_reason, gen.usage_completion_tokens))
    finally:
        gen.close()


def _sse(event: dict, seq) -> bytes:
    """One typed event (`event:` line and JSON data) with the next sequence number."""
    obj = {"type": event["type"], "sequence_number": next(seq), **event}
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _events(gen: Generation, turn: _Turn, builder: OutputBuilder):
    """response.created, in_progress, the items' events, then completed / incomplete / failed."""
    seq = itertools.count()
    start = turn.response("in_progress", [], None)
    yield _sse({"type": "response.created", "response": start}, seq)
    yield _sse({"type": "response.in_progress", "response": start}, seq)
    try:
        async for _, d in gen.events():
            if d.finish_reason == "error":
                failed = turn.response("failed", builder.output, None, {
                    "code": "server_error", "message": f"generation failed: {d.error}"})
                yield _sse({"type": "response.failed", "response": failed}, seq)
                return
            for e in builder.feed(d.text, 1 if d.token_id is not None else 0):
                yield _sse(e, seq)
            if d.finish_reason is None:
                continue
            for e in builder.finish(incomplete=d.finish_reason != "stop"):
                yield _sse(e, seq)
            final = turn.finish(builder, d.finish_reason, d.num_output_tokens)
            yield _sse({"type": _FINAL_EVENT[final["status"]], "response": final}, seq)
    except Exception as exc:  # the status line is gone: the error is the last event
        e = to_api_error(exc)
        yield _sse({"type": "error", "code": e.code, "message": e.message, "param": e.param}, seq)


def _stored(request: Request, store: ResponseStore) -> str:
    rid = request.path_params["response_id"]
    if store.get(rid) is None:
        raise APIError(404, f"no stored response {rid[:80]!r}: it expired, was deleted, or was "
                       "created with store: false", param="response_id", code="not_found")
    return rid


@operation(get=Operation("A stored response", response=shapes.RESPONSE, statuses=(404,)),
           delete=Operation("Forget a stored response", response=shapes.RESPONSE_DELETED,
                            statuses=(404,)))
async def stored_response(request: Request) -> Response:
    """GET returns a stored response, DELETE forgets it."""
    store = response_store(request.app)
    rid = _stored(request, store)
    if request.method == "DELETE":
        store.delete(rid)
        return JSONResponse({"id": rid, "object": "response", "deleted": True})
    if request.query_params.get("stream", "false").lower() == "true":
        raise bad_request("'stream' replays background responses, which edged does not run",
                          "stream")
    return JSONResponse(store.get(rid).response)


def responses_api_routes() -> list[Route]:
    return [Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", stored_response, methods=["GET", "DELETE"])]
