"""The generic JSON answer: {"tool_calls": […]} or {"response": "…"}."""

import json

import pytest

from edged.toolcall import GENERIC, parse_output

from tests.toolcall.streamcheck import NESTED_ARGS, REQUEST, args, assert_stream_matches, stream


def test_tool_calls():
    text = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Bern"}},
                                      {"name": "search", "arguments": NESTED_ARGS}]}, indent=1)
    msg = assert_stream_matches(GENERIC, text)
    assert [c.name for c in msg.tool_calls] == ["get_weather", "search"]
    assert args(msg.tool_calls[1]) == NESTED_ARGS and msg.content == ""


def test_single_tool_call_shape():
    text = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Bern"}}}'
    msg = assert_stream_matches(GENERIC, text)
    assert args(msg.tool_calls[0]) == {"city": "Bern"}


@pytest.mark.parametrize("reply", ["Hello!", "caf\u00e9 \"q\" \\ \n \U0001F600 \u65e5"])
@pytest.mark.parametrize("ascii_", [True, False])
def test_response_streams_decoded_text(reply, ascii_):
    text = json.dumps({"response": reply}, ensure_ascii=ascii_)
    msg = assert_stream_matches(GENERIC, text)
    assert msg.content == reply and msg.tool_calls == []
    _, _, deltas = stream(GENERIC, list(text))
    assert sum(1 for d in deltas if d.content) > 1  # streamed as it decodes, not at the end


def test_truncated_response_keeps_decoded_prefix():
    msg = parse_output('{"response": "Hello wor', GENERIC, REQUEST)
    assert msg.content == "Hello wor"


@pytest.mark.parametrize("text", [
    'Just text, no JSON.',
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Be',
    '{"tool_calls": [{"name": "nope", "arguments": {}}]}',
    '{"other": 1}',
])
def test_not_the_format_is_content(text):
    msg = parse_output(text, GENERIC, REQUEST)
    assert msg.tool_calls == [] and msg.content == text
    if "Be" not in text:  # the truncated call was already streamed: that stream diverges
        assert_stream_matches(GENERIC, text)
