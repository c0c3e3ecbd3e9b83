"""Anthropic's Messages API: POST /v1/messages (whole or streamed) and
/v1/messages/count_tokens over the same engines, templates, grammars and tool-call parsers as
/v1/chat/completions. Every error on /v1/messages* is Anthropic's shape (anthropic_errors)."""

from __future__ import annotations

import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edged.server import anthropic_schemas, chat_tools
from edged.server import openapi_shapes as shapes
from edged.server.anthropic_errors import anthropic_errors
from edged.server.anthropic_output import blocks_of, message, stop_reason
from edged.server.anthropic_stream import message_events
from edged.server.responses import SSEResponse
from edged.server.route_common import _collected, _prepare, _submit
from edged.server.spec import Operation, operation


def _plan(slot, req):
    """The chat plan; `thinking` enabled splits a thinking template's reasoning off (on a model
    that does not think it changes nothing), disabled leaves it to --reasoning-format."""
    reasoning_format = "auto" if req.thinking else slot.config.reasoning_format
    return chat_tools.plan_chat(slot.chat.source, req.tool_request, reasoning_format)


def _prompt(slot, plan, req) -> str:
    """The rendered prompt, continued by a final assistant turn's text (prefill)."""
    extra = None if req.thinking is None else {"enable_thinking": req.thinking}
    return chat_tools.render_prompt(slot.chat, plan, req.messages, req.tools, extra=extra,
                                    suffix=req.prefill)


async def _prompt_ids(slot, plan, req) -> list[int]:
    def encode():
        return slot.tokenizer.encode(_prompt(slot, plan, req), add_special=True, parse_special=True)

    return await run_in_threadpool(encode)


@operation(Operation("Anthropic: a message (Messages API)", body=anthropic_schemas.MESSAGES,
                     response=shapes.ANTHROPIC_MESSAGE, stream_media="text/event-stream",
                     stream_item=shapes.ANTHROPIC_EVENT, errors="anthropic", tag="anthropic",
                     statuses=(404, 500, 503)))
async def messages(request: Request) -> Response:
    slot, req, model = await _prepare(request, anthropic_schemas.parse_messages)
    plan = _plan(slot, req)
    ids = await _prompt_ids(slot, plan, req)
    if len(ids) < slot.max_len:
        # clients send a max_tokens sized for Anthropic's models (Claude Code: 32000); a local context
        # is smaller: answer up to its end (stop_reason max_tokens) rather than a 400
        req.max_tokens = min(req.max_tokens, slot.max_len - len(ids))
    options = chat_tools.submit_options(plan, req.constraint)
    msg_id = f"msg_{uuid.uuid4().hex}"
    gen = await _submit(slot, msg_id, [ids], req, lambda p: slot.max_len - p, options)
    parser = plan.parser() if plan.parses else None
    if req.stream:
        return SSEResponse(message_events(gen, parser, msg_id, model, len(ids), req.stop_sequences,
                                          slot.tokenizer), gen.close)
    try:
        if not await _collected(request, gen):
            return Response(status_code=499)
        c = gen.choices[0]
        content = blocks_of(parser, "".join(d.text for d in c.deltas))
        out_ids = [d.token_id for d in c.deltas if d.token_id is not None]
        reason, seq = stop_reason(c.finish_reason, any(b["type"] == "tool_use" for b in content),
                                  slot.tokenizer, out_ids, req.stop_sequences)
        return JSONResponse(message(msg_id, model, content, reason, seq, len(ids),
                                    gen.usage_completion_tokens))
    finally:
        gen.close()


@operation(Operation("Anthropic: the prompt's token count", body=anthropic_schemas.COUNT_TOKENS,
                     response=shapes.ANTHROPIC_TOKEN_COUNT, errors="anthropic", tag="anthropic",
                     statuses=(404, 503)))
async def count_tokens(request: Request) -> Response:
    """The prompt's token count as /v1/messages would render it (system, tools, history)."""
    slot, req, _ = await _prepare(request, anthropic_schemas.parse_count_tokens)
    ids = await _prompt_ids(slot, _plan(slot, req), req)
    return JSONResponse({"input_tokens": len(ids)})


def anthropic_routes() -> list[Route]:
    # other paths and methods under /v1/messages get Anthropic's 404 / 405 from app._http_exception
    return [Route("/v1/messages", anthropic_errors(messages), methods=["POST"]),
            Route("/v1/messages/count_tokens", anthropic_errors(count_tokens), methods=["POST"])]
