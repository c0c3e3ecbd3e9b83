"""/v1/chat/completions: render through the chat template, generate (under the request's
grammar: response_format, or the tools' when they are active), and answer with content, tool
calls and reasoning, whole or streamed as OpenAI does."""

from __future__ import annotations

import time
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from edged.server import chat_tools, schemas
from edged.server.errors import APIError, sse_error_event
from edged.server.generation import Generation
from edged.server.responses import (SSE_DONE, TokenText, chat_logprob_entry, finish_reason, is_logged,
                                    prompt_scores, usage, vllm_prompt_logprobs)
from edged.server.route_common import _chunk, _prepare, _respond, _submit
from edged.server import openapi_shapes as shapes
from edged.server.spec import Operation, operation


@operation(Operation("A chat completion", body=schemas.CHAT, response=shapes.CHAT_COMPLETION,
                     stream_media="text/event-stream", stream_item=shapes.CHAT_CHUNK,
                     statuses=(404, 500, 503)))
async def chat_completions(request: Request) -> Response:
    slot, req, model = await _prepare(request, schemas.parse_chat)
    tok = slot.tokenizer
    plan = chat_tools.plan_chat(slot.chat.source, req.tool_request,
                                req.reasoning_format or slot.config.reasoning_format)

    def render_and_encode():
        text = chat_tools.render_prompt(slot.chat, plan, req.messages, req.tools)
        return tok.encode(text, add_special=True, parse_special=True)

    ids = await run_in_threadpool(render_and_encode)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    gen = await _submit(slot, rid, [ids], req, lambda p: slot.max_len - p,
                        chat_tools.submit_options(plan, req.constraint))
    head = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model}
    tt = TokenText(tok)

    def choices():
        if req.prompt_logprobs is not None:  # vLLM's field, beside the choices (one prompt)
            head["prompt_logprobs"] = vllm_prompt_logprobs(ids, prompt_scores(gen.choices[0].deltas), tt,
                                                           req.prompt_logprobs)
        out = []
        for c in gen.choices:
            text = "".join(d.text for d in c.deltas)
            lp = None
            if req.top_logprobs is not None:
                lp = {"content": [chat_logprob_entry(d, tt) for d in c.deltas if is_logged(d, tok)]}
            message, reason = {"role": "assistant", "content": text}, c.finish_reason
            if plan.parses:
                parsed = plan.parser().parse(text)
                message, reason = chat_tools.message_of(parsed), chat_tools.finish_of(parsed, reason)
            out.append({"index": c.index, "message": message, "logprobs": lp,
                        "finish_reason": finish_reason(reason)})
        return out

    chunk_head = {**head, "object": "chat.completion.chunk"}
    events = _chat_events(gen, req, plan, chunk_head, len(ids), tt) if req.stream else None
    return await _respond(request, gen, events, head, choices, len(ids))


def _choice_chunk(index: int, delta: dict, lp=None, reason=None) -> dict:
    return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason(reason)}


async def _chat_events(gen: Generation, req, plan, head: dict, n_prompt: int, tt):
    yield _chunk(head, req, [_choice_chunk(c.index, {"role": "assistant", "content": ""})
                             for c in gen.choices])
    parsers = {c.index: plan.parser() for c in gen.choices} if plan.parses else None
    async for c, d in gen.events():
        lp = None
        if req.top_logprobs is not None and is_logged(d, tt.tok):
            lp = {"content": [chat_logprob_entry(d, tt)]}
        if d.finish_reason == "error":
            yield sse_error_event(APIError(500, f"generation failed: {d.error}", code="engine_error"))
            continue
        if parsers is not None:
            for chunk in _parsed_chunks(parsers[c.index], c.index, d, lp):
                yield _chunk(head, req, [chunk])
            continue
        if not d.text and lp is None and d.finish_reason is None:
            continue  # UTF-8 or stop-string look-ahead held the text back
        delta = {"content": d.text} if d.text or lp is not None else {}
        yield _chunk(head, req, [_choice_chunk(c.index, delta, lp, d.finish_reason)])
    if req.include_usage:
        yield _chunk(head, req, [], usage(n_prompt, gen.usage_completion_tokens))
    yield SSE_DONE


def _parsed_chunks(parser, index: int, d, lp) -> list[dict]:
    """The choice chunks of one engine delta through the tool-call / reasoning parser: content,
    reasoning_content and tool_calls pieces, then, on the last delta, the finish reason."""
    pieces = parser.feed(d.text) if d.text else []
    out = [_choice_chunk(index, p.to_openai()) for p in pieces]
    if lp is not None:
        out.append(_choice_chunk(index, {}, lp))
    if d.finish_reason is not None:
        rest, parsed = parser.finish()
        out += [_choice_chunk(index, p.to_openai()) for p in rest]
        out.append(_choice_chunk(index, {}, None, chat_tools.finish_of(parsed, d.finish_reason)))
    return out
