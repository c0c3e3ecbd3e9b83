"""Ollama's /api/chat and /api/generate over the same engines, templates, grammars and tool-call
parsers as /v1/chat/completions: one JSON object, or NDJSON lines ending with `done: true` and the
durations. An empty prompt / message list loads the model (with keep_alive 0: unloads it)."""

from __future__ import annotations

import time
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edged.server import chat_tools, ollama_models, ollama_schemas, schemas
from edged.server import openapi_shapes as shapes
from edged.server.errors import APIError, bad_request
from edged.server.generation import Generation
from edged.server.ollama_responses import (NDJSONResponse, done_reason, error_object, line,
                                           logprob_entries, stats, timestamp, tool_calls)
from edged.server.responses import TokenText
from edged.server.spec import Operation, operation
from edged.server.route_common import (_collected, _json_body, _prepare, _submit, model_slot,
                                       set_keep_alive)


# -- shared ------------------------------------------------------------------------------------

def _plan(slot, req, tools=None):
    """The chat plan (tool format, reasoning split) of a request; `think: true` on a model whose
    template does not think is a 400, as Ollama answers."""
    reasoning_format = "auto" if req.think else slot.config.reasoning_format
    plan = chat_tools.plan_chat(slot.chat.source, tools, reasoning_format)
    if req.think and plan.reasoning is None:
        raise bad_request(f"'{slot.model_name}' does not support thinking", "think")
    return plan


def _extra(req) -> dict | None:
    """Template variables for `think` (Qwen 3 style templates read enable_thinking)."""
    return None if req.think is None else {"enable_thinking": req.think}


async def _load_or_unload(request: Request, body: dict, empty_message: dict | None) -> Response:
    """Ollama's load (no prompt / messages) and unload (the same with keep_alive 0) requests."""
    model = ollama_schemas.model_name(body)
    keep_alive = schemas._keep_alive(body)
    if keep_alive == 0:
        model, reason = await ollama_models.unload(request.app.state.edged, model), "unload"
    else:
        slot = await model_slot(request, model)  # loaded, and held until the response ends
        set_keep_alive(request, keep_alive)
        model, reason = slot.model_name, "load"
    head = {"model": model, "created_at": timestamp()}
    if empty_message is not None:
        head["message"] = empty_message
    else:
        head["response"] = ""
    return JSONResponse({**head, "done": True, "done_reason": reason})


# -- /api/chat -----------------------------------------------------------------------------------

@operation(Operation("Ollama: a chat reply", body=ollama_schemas.CHAT, response=shapes.OLLAMA_CHAT,
                     stream_media="application/x-ndjson", stream_item=shapes.OLLAMA_CHAT,
                     errors="ollama", statuses=(404, 500, 503), tag="ollama"))
async def api_chat(request: Request) -> Response:
    started = time.monotonic()
    body = ollama_schemas.check_object(await _json_body(request))
    if ollama_schemas.is_empty(body, ollama_schemas.CHAT, "messages"):
        return await _load_or_unload(request, body, {"role": "assistant", "content": ""})
    slot, req, model = await _prepare(request, ollama_schemas.parse_chat)
    load_s = time.monotonic() - started
    tok = slot.tokenizer
    plan = _plan(slot, req, req.tool_request)

    def render_and_encode():
        text = chat_tools.render_prompt(slot.chat, plan, req.messages, req.tools, extra=_extra(req))
        return tok.encode(text, add_special=True, parse_special=True)

    ids = await run_in_threadpool(render_and_encode)
    gen = await _submit(slot, f"ollama-{uuid.uuid4().hex}", [ids], req, lambda p: slot.max_len - p,
                        chat_tools.submit_options(plan, req.constraint))
    tt = TokenText(tok)
    if req.stream:
        return NDJSONResponse(_chat_lines(gen, req, plan, model, tt, started, load_s, len(ids)),
                              gen.close)
    try:
        if not await _collected(request, gen):
            return Response(status_code=499)
        c = gen.choices[0]
        text = "".join(d.text for d in c.deltas)
        message = {"role": "assistant", "content": text}
        if plan.parses:
            message = _message(plan.parser().parse(text))
        out = {"model": model, "created_at": timestamp(), "message": message, "done": True,
               "done_reason": done_reason(c.finish_reason),
               **stats(gen, started, load_s, len(ids))}
        if req.top_logprobs is not None:
            out["logprobs"] = logprob_entries(c.deltas, tt)
        return JSONResponse(out)
    finally:
        gen.close()


def _message(parsed) -> dict:
    """Ollama's assistant message: content, thinking, tool calls with object arguments."""
    msg = {"role": "assistant", "content": parsed.content or ""}
    if parsed.reasoning_content is not None:
        msg["thinking"] = parsed.reasoning_content
    if parsed.tool_calls:
        msg["tool_calls"] = tool_calls(parsed.tool_calls)
    return msg


async def _chat_lines(gen: Generation, req, plan, model: str, tt, started: float, load_s: float,
                      n_prompt: int):
    """Content and thinking as they come; tool calls once complete (Ollama sends whole calls,
    with object arguments), then the final object."""
    parser = plan.parser() if plan.parses else None

    def piece(content: str = "", thinking: str | None = None, calls=None, lp=None) -> bytes:
        msg = {"role": "assistant", "content": content}
        if thinking is not None:
            msg["thinking"] = thinking
        if calls:
            msg["tool_calls"] = tool_calls(calls)
        obj = {"model": model, "created_at": timestamp(), "message": msg, "done": False}
        if lp is not None:
            obj["logprobs"] = lp
        return line(obj)

    try:
        async for c, d in gen.events():
            if d.finish_reason == "error":
                yield line(error_object(APIError(500, f"generation failed: {d.error}"))[0])
                return
            lp = logprob_entries([d], tt) if req.top_logprobs is not None else None
            if parser is None:
                if d.text or lp:
                    yield piece(d.text, lp=lp)
            else:
                for p in parser.feed(d.text) if d.text else []:
                    if p.content or p.reasoning_content:
                        yield piece(p.content or "", p.reasoning_content)
                if lp:
                    yield piece(lp=lp)
            if d.finish_reason is None:
                continue
            if parser is not None:
                rest, parsed = parser.finish()
                for p in rest:
                    if p.content or p.reasoning_content:
                        yield piece(p.content or "", p.reasoning_content)
                if parsed.tool_calls:
                    yield piece(calls=parsed.tool_calls)
            yield line({"model": model, "created_at": timestamp(),
                        "message": {"role": "assistant", "content": ""}, "done": True,
                        "done_reason": done_reason(d.finish_reason),
                        **stats(gen, started, load_s, n_prompt)})
    except Exception as e:  # the status line is gone: the error becomes the last line
        yield line(error_object(e)[0])


# -- /api/generate -------------------------------------------------------------------------------

@operation(Operation("Ollama: a completion", body=ollama_schemas.GENERATE,
                     response=shapes.OLLAMA_GENERATE, stream_media="application/x-ndjson",
                     stream_item=shapes.OLLAMA_GENERATE, errors="ollama", statuses=(404, 500, 503),
                     tag="ollama"))
async def api_generate(request: Request) -> Response:
    started = time.monotonic()
    body = ollama_schemas.check_object(await _json_body(request))
    if ollama_schemas.is_empty(body, ollama_schemas.GENERATE, "prompt"):
        return await _load_or_unload(request, body, None)
    slot, req, model = await _prepare(request, ollama_schemas.parse_generate)
    load_s = time.monotonic() - started
    tok = slot.tokenizer
    plan = None if req.raw else _plan(slot, req)

    def encode():
        text = req.prompt
        if plan is not None:  # the model's chat template, as Ollama applies its own
            messages = ([{"role": "system", "content": req.system}] if req.system else []) + [
                {"role": "user", "content": req.prompt}]
            text = slot.chat.render(messages, add_generation_prompt=True, extra=_extra(req))
            chat_tools.note_prompt(plan, text)
        # a context continues an earlier exchange, which began with the special tokens already
        return req.context + tok.encode(text, add_special=not req.context, parse_special=True)

    ids = await run_in_threadpool(encode)
    gen = await _submit(slot, f"ollama-{uuid.uuid4().hex}", [ids], req, lambda p: slot.max_len - p,
                        chat_tools.submit_options(plan, req.constraint) if plan is not None else None)
    tt = TokenText(tok)
    parses = plan is not None and plan.parses
    if req.stream:
        return NDJSONResponse(_generate_lines(gen, req, plan if parses else None, model, tt,
                                              started, load_s, ids), gen.close)
    try:
        if not await _collected(request, gen):
            return Response(status_code=499)
        c = gen.choices[0]
        text = "".join(d.text for d in c.deltas)
        out = {"model": model, "created_at": timestamp(), "response": text}
        if parses:
            parsed = plan.parser().parse(text)
            out["response"] = parsed.content
            if parsed.reasoning_content is not None:
                out["thinking"] = parsed.reasoning_content
        out.update(done=True, done_reason=done_reason(c.finish_reason))
        if not req.raw:
            out["context"] = ids + _output_ids(c.deltas, tok)
        out.update(stats(gen, started, load_s, len(ids)))
        if req.top_logprobs is not None:
            out["logprobs"] = logprob_entries(c.deltas, tt)
        return JSONResponse(out)
    finally:
        gen.close()


def _output_ids(deltas, tok) -> list[int]:
    """The generated token ids for `context`, without a final end-of-generation token."""
    ids = [d.token_id for d in deltas if d.token_id is not None]
    if ids and deltas[-1].finish_reason == "stop" and tok.is_eog(ids[-1]):
        ids.pop()
    return ids


async def _generate_lines(gen: Generation, req, plan, model: str, tt, started: float,
                          load_s: float, ids: list[int]):
    parser = plan.parser() if plan is not None else None
    deltas = []

    def piece(response: str = "", thinking: str | None = None, lp=None) -> bytes:
        obj = {"model": model, "created_at": timestamp(), "response": response}
        if thinking is not None:
            obj["thinking"] = thinking
        obj["done"] = False
        if lp is not None:
            obj["logprobs"] = lp
        return line(obj)

    try:
        async for c, d in gen.events():
            if d.finish_reason == "error":
                yield line(error_object(APIError(500, f"generation failed: {d.error}"))[0])
                return
            deltas.append(d)
            lp = logprob_entries([d], tt) if req.top_logprobs is not None else None
            pieces = parser.feed(d.text) if parser is not None and d.text else []
            if parser is None and (d.text or lp):
                yield piece(d.text, lp=lp)
            for p in pieces:
                if p.content or p.reasoning_content:
                    yield piece(p.content or "", p.reasoning_content)
            if parser is not None and lp:
                yield piece(lp=lp)
            if d.finish_reason is None:
                continue
            if parser is not None:
                for p in parser.finish()[0]:
                    if p.content or p.reasoning_content:
                        yield piece(p.content or "", p.reasoning_content)
            final = {"model": model, "created_at": timestamp(), "response": "", "done": True,
                     "done_reason": done_reason(d.finish_reason)}
            if not req.raw:
                final["context"] = ids + _output_ids(deltas, tt.tok)
            yield line({**final, **stats(gen, started, load_s, len(ids))})
    except Exception as e:  # the status line is gone: the error becomes the last line
        yield line(error_object(e)[0])
