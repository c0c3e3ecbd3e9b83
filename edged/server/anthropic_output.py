"""Anthropic's response pieces: content blocks (thinking, text, tool_use) from the output
parser, as stream events (ContentBlocks, fed the parser's pieces) and as the whole message's
`content` (blocks_of the parsed message); stop_reason; the message."""

from __future__ import annotations

import json

from edged.toolcall import StreamDelta

# engine finish reasons -> Anthropic's stop_reason ("stop" is refined by `stop_reason`); "abort"
# only reaches a client on a drain timeout: the turn was cut and may be resent to continue
_STOP = {"length": "max_tokens", "abort": "pause_turn", "error": "end_turn"}


class ContentBlocks:
    """Blocks from parser pieces. A block opens when the kind of piece changes (thinking, text,
    each tool call) and the open one closes. Whitespace-only text opens no block until more text
    comes (a template's newline before a call is no block). `add` / `close` return the events."""

    def __init__(self):
        self.types: list[str] = []  # each opened block's type
        self._open: tuple | None = None  # ("thinking",), ("text",) or ("tool_use", call index)
        self._space = ""  # whitespace held back before a text block

    @property
    def has_tool_use(self) -> bool:
        return "tool_use" in self.types

    def add(self, piece: StreamDelta) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if piece.reasoning_content:
            if self._open != ("thinking",):
                events += self._start(("thinking",), {"type": "thinking", "thinking": "",
                                                      "signature": ""})
            events += self._delta({"type": "thinking_delta", "thinking": piece.reasoning_content})
        elif piece.content:
            text = piece.content
            if self._open != ("text",):
                if not (self._space + text).strip():
                    self._space += text
                    return events
                text, self._space = self._space + text, ""
                events += self._start(("text",), {"type": "text", "text": ""})
            events += self._delta({"type": "text_delta", "text": text})
        elif piece.tool_call is not None:
            tc = piece.tool_call
            if tc.id is not None:
                events += self._start(("tool_use", tc.index), {"type": "tool_use", "id": tc.id,
                                                               "name": tc.name, "input": {}})
            if tc.arguments:
                events += self._delta({"type": "input_json_delta", "partial_json": tc.arguments})
        return events

    def close(self) -> list[tuple[str, dict]]:
        """The open block's stop event."""
        self._space = ""
        return self._stop()

    def _start(self, key: tuple, block: dict) -> list[tuple[str, dict]]:
        events = self._stop()
        self._space = ""  # whitespace before another kind of block belongs to no block
        self._open = key
        self.types.append(block["type"])
        return events + [("content_block_start", {"type": "content_block_start",
                                                  "index": len(self.types) - 1,
                                                  "content_block": block})]

    def _delta(self, delta: dict) -> list[tuple[str, dict]]:
        return [("content_block_delta", {"type": "content_block_delta",
                                         "index": len(self.types) - 1, "delta": delta})]

    def _stop(self) -> list[tuple[str, dict]]:
        if self._open is None:
            return []
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop",
                                        "index": len(self.types) - 1})]


def pieces_of(parser, text: str, final: bool) -> list[StreamDelta]:
    """The parser's pieces for a text delta (parser None: the text is all content); with final,
    the parser's last pieces too."""
    if parser is None:
        return [StreamDelta(content=text)] if text else []
    out = parser.feed(text) if text else []
    if final:
        out += parser.finish()[0]
    return out


def blocks_of(parser, text: str) -> list[dict]:
    """The whole reply's content: thinking, text (unless only whitespace, as in a stream), then
    the tool calls; a call cut off by max_tokens stays text, as on the OpenAI route."""
    if parser is None:
        return [{"type": "text", "text": text}] if text.strip() else []
    parsed = parser.parse(text)
    out = []
    if parsed.reasoning_content:
        out.append({"type": "thinking", "thinking": parsed.reasoning_content, "signature": ""})
    if parsed.content.strip():
        out.append({"type": "text", "text": parsed.content})
    out += [{"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)}
            for c in parsed.tool_calls]
    return out


def matched_stop(tok, output_ids: list[int], stops: tuple[str, ...]) -> str | None:
    """Which stop sequence ended the output: the one the engine cut at, the earliest in the
    decoded output (the engine reports only that a stop string matched)."""
    if not stops:
        return None
    text = tok.decode(output_ids)
    hits = [(text.find(s), k, s) for k, s in enumerate(stops) if s in text]
    return min(hits)[2] if hits else None


def stop_reason(engine_reason: str | None, has_tool_use: bool, tok, output_ids: list[int],
                stops: tuple[str, ...]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): tool_use when a stopped reply holds calls, stop_sequence
    when a stop string (not an end-of-generation token) ended it, else end_turn."""
    if engine_reason != "stop":
        return _STOP.get(engine_reason, "end_turn"), None
    if has_tool_use:
        return "tool_use", None
    if output_ids and not tok.is_eog(output_ids[-1]):
        seq = matched_stop(tok, output_ids, stops)
        if seq is not None:
            return "stop_sequence", seq
    return "end_turn", None


def message(msg_id: str, model: str, content: list, reason: str | None, seq: str | None,
            input_tokens: int, output_tokens: int) -> dict:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": seq,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}
