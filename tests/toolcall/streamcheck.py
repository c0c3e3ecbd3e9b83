"""Shared checks: streamed deltas must reassemble to the non-streamed parse at any split."""

from __future__ import annotations

import json
import random

from edged.toolcall import OutputParser, parse_tool_request

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"}}}}}
PYTHON = {"type": "function", "function": {
    "name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}
REQUEST = parse_tool_request([WEATHER, SEARCH, PYTHON], "auto")

# Nested arguments with escapes, quotes, a newline, unicode (BMP and astral) and \u escapes.
NESTED_ARGS = {"query": "caf\u00e9 \"quoted\" \\ back\nslash \U0001F600 \u00fc",
               "filters": {"tags": ["a", "b", {"deep": [1, 2.5, True, None]}], "lang": "\u65e5\u672c"}}
NESTED_JSON = json.dumps(NESTED_ARGS)  # ASCII with \\uXXXX escapes
NESTED_JSON_UTF8 = json.dumps(NESTED_ARGS, ensure_ascii=False)


def chunkings(text: str, seeds=range(6)):
    yield [text]
    yield list(text)
    for seed in seeds:
        rng = random.Random(seed)
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 9)
            pieces.append(text[i:i + n])
            i += n
        yield pieces


def stream(fmt, text_pieces, request=REQUEST, reasoning=None, starts_inside=False):
    """Feed the pieces; returns (reassembled dict, the parser's final message, deltas)."""
    p = OutputParser(fmt, request, reasoning, starts_inside)
    deltas = []
    for piece in text_pieces:
        deltas += p.feed(piece)
    tail, msg = p.finish()
    deltas += tail
    return reassemble(deltas), msg, deltas


def reassemble(deltas) -> dict:
    content, reasoning, calls = "", "", []
    for d in deltas:
        if d.content is not None:
            content += d.content
        elif d.reasoning_content is not None:
            reasoning += d.reasoning_content
        else:
            tc = d.tool_call
            if tc.index == len(calls):
                assert tc.id is not None and tc.name, "a call's first delta carries id and name"
                calls.append({"id": tc.id, "name": tc.name, "arguments": tc.arguments})
            else:
                assert tc.index == len(calls) - 1 and tc.id is None
                calls[tc.index]["arguments"] += tc.arguments
    return {"content": content, "reasoning": reasoning, "calls": calls}


def assert_stream_matches(fmt, text, request=REQUEST, reasoning=None, starts_inside=False):
    """Every chunking reassembles exactly to the complete parse; returns that parse."""
    whole = OutputParser(fmt, request, reasoning, starts_inside).parse(text)
    for pieces in chunkings(text):
        got, msg, _ = stream(fmt, pieces, request, reasoning, starts_inside)
        assert got["content"] == whole.content, pieces
        assert got["reasoning"] == (whole.reasoning_content or "")
        assert [(c["name"], c["arguments"]) for c in got["calls"]] == \
            [(c.name, c.arguments) for c in whole.tool_calls]
        assert [c["id"] for c in got["calls"]] == [c.id for c in msg.tool_calls]
    return whole


def args(call) -> object:
    return json.loads(call.arguments)


def assert_content_fallback(fmt, text, request=REQUEST):
    """A malformed or truncated call is returned as text, streamed or not, never raising."""
    msg = OutputParser(fmt, request).parse(text)
    assert msg.tool_calls == [] and msg.content == text.strip()
    _, streamed, _ = stream(fmt, list(text), request)
    assert streamed.content == msg.content
