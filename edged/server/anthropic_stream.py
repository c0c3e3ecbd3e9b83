"""The Messages API's stream: message_start, ping, then per block content_block_start /
content_block_delta (text_delta, thinking_delta, input_json_delta) / content_block_stop, then
message_delta (stop_reason, stop_sequence, usage.output_tokens) and message_stop. An error after
the start is an `event: error`, the stream's last."""

from __future__ import annotations

from edged.server.anthropic_errors import error_event, sse_event
from edged.server.anthropic_output import ContentBlocks, message, pieces_of, stop_reason
from edged.server.errors import APIError
from edged.server.generation import Generation


async def message_events(gen: Generation, parser, msg_id: str, model: str, n_prompt: int,
                         stops: tuple[str, ...], tok):
    """The SSE bytes of one reply; `parser` is the chat plan's OutputParser (None: plain text)."""
    yield sse_event("message_start", {"type": "message_start", "message": message(
        msg_id, model, [], None, None, n_prompt, 0)})
    yield sse_event("ping", {"type": "ping"})
    blocks, ids = ContentBlocks(), []
    try:
        async for _, d in gen.events():
            if d.finish_reason == "error":
                yield error_event(APIError(500, f"generation failed: {d.error}"))
                return
            if d.token_id is not None:
                ids.append(d.token_id)
            final = d.finish_reason is not None
            for piece in pieces_of(parser, d.text, final):
                for name, data in blocks.add(piece):
                    yield sse_event(name, data)
            if not final:
                continue
            for name, data in blocks.close():
                yield sse_event(name, data)
            reason, seq = stop_reason(d.finish_reason, blocks.has_tool_use, tok, ids, stops)
            yield sse_event("message_delta", {
                "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                "usage": {"output_tokens": gen.usage_completion_tokens}})
            yield sse_event("message_stop", {"type": "message_stop"})
    except Exception as e:  # the status line is gone: the error becomes the last event
        yield error_event(e)
