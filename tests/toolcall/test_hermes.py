"""Hermes 2/3 Pro and Qwen 2.5/3 outputs, written from their documented format."""

import pytest

from edged.toolcall import HERMES, parse_output

from tests.toolcall.streamcheck import (NESTED_ARGS, NESTED_JSON, NESTED_JSON_UTF8, REQUEST, args,
                                        assert_content_fallback, assert_stream_matches, stream)

ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'


def test_single_call():
    msg = assert_stream_matches(HERMES, ONE)
    assert msg.content == ""
    [call] = msg.tool_calls
    assert call.name == "get_weather" and args(call) == {"city": "Paris", "unit": "c"}
    assert call.id.startswith("call_") and len(call.id) > 10
    assert msg.finish_reason == "tool_calls"


def test_several_calls_text_before_and_nested_unicode():
    text = ("I'll look both up.\n\n" + ONE + "\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
            + NESTED_JSON + "}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
            + NESTED_JSON_UTF8 + "}\n</tool_call>")
    msg = assert_stream_matches(HERMES, text)
    assert msg.content == "I'll look both up."
    assert [c.name for c in msg.tool_calls] == ["get_weather", "search", "search"]
    assert args(msg.tool_calls[1]) == NESTED_ARGS == args(msg.tool_calls[2])
    assert len({c.id for c in msg.tool_calls}) == 3


def test_plain_text_and_tag_mentions_stay_content():
    text = "Use the <tool_call> tag < like this >, or not."
    msg = assert_stream_matches(HERMES, text)
    assert msg.content == text and msg.tool_calls == []


@pytest.mark.parametrize("cut", [len("<tool_call>\n{\"name\": \"get_w"), len(ONE) - 25,
                                 len("<tool_call>\n")])
def test_truncated_call_is_content(cut):
    text = "Checking. " + ONE[:cut]
    msg = parse_output(text, HERMES, REQUEST)
    assert msg.tool_calls == [] and msg.content == text.strip()


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}} trailing\n</tool_call>',
    '<tool_call>\nnot json at all\n</tool_call>',
    '<tool_call>\n{"name": "unknown_tool", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": 42}\n</tool_call>',
])
def test_malformed_call_is_content(bad):
    assert_content_fallback(HERMES, bad)


def test_stringified_arguments_and_key_order():
    text = ('<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>')
    msg = assert_stream_matches(HERMES, text)
    assert [args(c) for c in msg.tool_calls] == [{"city": "Oslo"}, {"city": "Rome"}]


def test_missing_close_tag_at_end_is_accepted():
    msg = assert_stream_matches(HERMES, ONE[:-len("</tool_call>")])
    assert [c.name for c in msg.tool_calls] == ["get_weather"]


def test_content_never_includes_a_trigger_prefix_while_streaming():
    _, _, deltas = stream(HERMES, list("Sure.\n" + ONE))
    assert "".join(d.content for d in deltas if d.content is not None) == "Sure."


def test_streamed_first_delta_shape():
    _, _, deltas = stream(HERMES, [ONE[:60], ONE[60:]])
    first = [d for d in deltas if d.tool_call][0].to_openai()["tool_calls"][0]
    assert first["type"] == "function" and first["function"]["name"] == "get_weather"
    assert first["index"] == 0 and first["id"].startswith("call_")


def test_truncated_after_commit_marks_divergence():
    # Cut by max_tokens inside the arguments: the stream already sent the call's start.
    got, msg, _ = stream(HERMES, list(ONE[:-30]))
    assert got["calls"][0]["name"] == "get_weather"
    assert msg.tool_calls == [] and msg.content == ONE[:-30]
