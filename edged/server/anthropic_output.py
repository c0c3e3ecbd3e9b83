"""Anthropic's response pieces: content blocks (thinking, text, tool_use) built from the output
parser's pieces, as stream events and as the whole message's `content`; stop_reason; the message.

One path for both: the whole reply is the parser fed the whole text at once, so a streamed reply
and a whole one open the same blocks."""

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
        self.blocks: list[dict] = []
        self._open: tuple | None = None  # ("thinking",), ("text",) or ("tool_use", call index)
        self._args: dict[int, str] = {}  # block index -> a tool call's arguments so far
        self._space = ""  # whitespace held back before a text block

    @property
    def has_tool_use(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)

    def add(self, piece: StreamDelta) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if piece.reasoning_content:
            events += self._start(("thinking",), {"type": "thinking", "thinking": "", "signature": ""})
            events += self._delta("thinking", {"type": "thinking_delta",
                                               "thinking": piece.reasoning_content})
        elif piece.content:
            text = piece.content
            if self._open != ("text",):
                if not (self._space + text).strip():
                    self._space += text
                    return events
                text, self._space = self._space + text, ""
                events += self._start(("text",), {"type": "text", "text": ""})
            events += self._delta("text", {"type": "text_delta", "text": text})
        elif piece.tool_call is not None:
            tc = piece.tool_call
            if tc.id is not None:
                events += self._start(("tool_use", tc.index), {"type": "tool_use", "id": tc.id,
                                                               "name": tc.name, "input": {}})
            if tc.arguments:
                events += self._delta("input", {"type": "input_json_delta",
                                                "partial_json": tc.arguments})
        return events

    def close(self) -> list[tuple[str, dict]]:
        """The open block's stop event; tool inputs parsed into `blocks`."""
        self._space = ""
        events = self._stop()
        for i, args in self._args.items():
            self.blocks[i]["input"] = json.loads(args) if args.strip() else {}
        return events

    def _start(self, key: tuple, block: dict) -> list[tuple[str, dict]]:
        events = self._stop()
        self._open = key
        self.blocks.append(dict(block))
        if block["type"] == "tool_use":
            self._args[len(self.blocks) - 1] = ""
        return events + [("content_block_start", {"type": "content_block_start",
                                                  "index": len(self.blocks) - 1,
                                                  "content_block": block})]

    def _delta(self, field: str, delta: dict) -> list[tuple[str, dict]]:
        i = len(self.blocks) - 1
        if field == "input":
            self._args[i] += delta["partial_json"]
        else:
            self.blocks[i][field] += delta[field]
        return [("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})]

    def _stop(self) -> list[tuple[str, dict]]:
        if self._open is None:
            return []
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop",
                                        "index": len(self.blocks) - 1})]


def pieces_of(parser, text: str, final: bool) -> list[StreamDelta]:
    """The parser's pieces for a text delta (parser None: the text is all content); with final,
    the parser's last pieces too."""
    if parser is None:
        return [StreamDelta(content=text)] if text else []
    out = parser.feed(text) if text else []
    if final:
        out += parser.finish()[0]
    return out


def matched_stop(tok, output_ids: list[int], stops: tuple[str, ...]) -> str | None:
    """Which stop sequence ended the output: the one the engine cut at, the earliest in the
    decoded output (the engine reports only that a stop string matched)."""
    if not stops:
        return None
    text = tok.decode(output_ids)
    hits = [(text.find(s), k, s) for k, s in enumerate(stops) if s in text]
    return min(hits)[2] if hits else None


def stop_reason(engine_reason: str | None, blocks: ContentBlocks, tok, output_ids: list[int],
                stops: tuple[str, ...]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): tool_use when a stopped reply holds calls, stop_sequence
    when a stop string (not an end-of-generation token) ended it, else end_turn."""
    if engine_reason != "stop":
        return _STOP.get(engine_reason, "end_turn"), None
    if blocks.has_tool_use:
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
