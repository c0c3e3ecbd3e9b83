"""Llama 3.1-3.3 outputs: JSON calls with "parameters", and <|python_tag|> calls."""

import pytest

from edged.toolcall import LLAMA3, parse_tool_request

from tests.toolcall.streamcheck import (NESTED_ARGS, NESTED_JSON, WEATHER, args,
                                        assert_content_fallback, assert_stream_matches)

CALL = '{"name": "get_weather", "parameters": {"city": "Lisbon"}}'


@pytest.mark.parametrize("text", [
    CALL,
    '{"type": "function", "name": "get_weather", "parameters": {"city": "Lisbon"}}',
    '\n  ' + CALL + '\n',
])
def test_json_call(text):
    msg = assert_stream_matches(LLAMA3, text)
    [call] = msg.tool_calls
    assert call.name == "get_weather" and args(call) == {"city": "Lisbon"} and msg.content == ""


def test_several_calls_separated_by_semicolons_nested():
    text = CALL + '; {"name": "search", "parameters": ' + NESTED_JSON + '}'
    msg = assert_stream_matches(LLAMA3, text)
    assert [c.name for c in msg.tool_calls] == ["get_weather", "search"]
    assert args(msg.tool_calls[1]) == NESTED_ARGS and msg.content == ""


def test_text_before_call_and_json_content_stays_content():
    msg = assert_stream_matches(LLAMA3, 'Let me check. ' + CALL)
    assert msg.content == "Let me check." and len(msg.tool_calls) == 1
    text = 'The config is {"debug": true, "name": "x"} and {braces} too.'
    msg = assert_stream_matches(LLAMA3, text)
    assert msg.content == text and msg.tool_calls == []


def test_python_tag_json_builtin_and_code():
    msg = assert_stream_matches(LLAMA3, '<|python_tag|>' + CALL)
    assert args(msg.tool_calls[0]) == {"city": "Lisbon"}
    req = parse_tool_request([WEATHER, {"type": "function", "function": {
        "name": "brave_search", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}}}}}])
    msg = assert_stream_matches(LLAMA3, '<|python_tag|>brave_search.call(query="caf\u00e9 \\"x\\"")',
                                request=req)
    assert msg.tool_calls[0].name == "brave_search"
    assert args(msg.tool_calls[0]) == {"query": 'caf\u00e9 "x"'}
    code = "<|python_tag|>import math\nprint(math.pi)"
    msg = assert_stream_matches(LLAMA3, code)
    assert msg.tool_calls[0].name == "python"
    assert args(msg.tool_calls[0]) == {"code": "import math\nprint(math.pi)"}


@pytest.mark.parametrize("text", [
    CALL[:-8],                                               # truncated
    '{"name": "get_weather", "parameters": {"city": }}',    # malformed
    '{"name": "nope", "parameters": {}}',                   # not a tool
    '<|python_tag|>brave_search.call(query="x")',           # no such tool, no code tool
])
def test_bad_calls_are_content(text):
    assert_content_fallback(LLAMA3, text, parse_tool_request([WEATHER], "auto"))
