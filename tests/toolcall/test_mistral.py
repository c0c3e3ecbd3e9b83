"""Mistral outputs: [TOOL_CALLS][…] arrays (Nemo, Small) and v11+ name[ARGS]{…} calls."""

import re

import pytest

from edged.toolcall import MISTRAL, MISTRAL_ARGS

from tests.toolcall.streamcheck import (NESTED_ARGS, NESTED_JSON_UTF8, args,
                                        assert_content_fallback, assert_stream_matches)

ARRAY = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}, "id": "abcDEF123"}, '
         '{"name": "search", "arguments": ' + NESTED_JSON_UTF8 + ', "id": "x1y2z3w4v"}]')


def test_array_of_calls():
    msg = assert_stream_matches(MISTRAL, ARRAY)
    assert [c.name for c in msg.tool_calls] == ["get_weather", "search"]
    assert args(msg.tool_calls[1]) == NESTED_ARGS
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in msg.tool_calls)


def test_text_before_calls():
    msg = assert_stream_matches(MISTRAL, "Sure, checking. " + ARRAY)
    assert msg.content == "Sure, checking." and len(msg.tool_calls) == 2


def test_args_form():
    text = ('[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}[TOOL_CALLS]search[CALL_ID]a1b2c3d4e'
            '[ARGS]' + NESTED_JSON_UTF8)
    for fmt in (MISTRAL_ARGS, MISTRAL):  # both parse either form
        msg = assert_stream_matches(fmt, text)
        assert [c.name for c in msg.tool_calls] == ["get_weather", "search"]
        assert args(msg.tool_calls[1]) == NESTED_ARGS


@pytest.mark.parametrize("text", [
    ARRAY[:-20],
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}} {"x": 1}]',
    '[TOOL_CALLS]get_weather[ARGS]{"city": ',
    '[TOOL_CALLS]get_weather{"city": "Nice"}',
    '[TOOL_CALLS][{"name": "nope", "arguments": {}}]',
])
def test_bad_calls_are_content(text):
    assert_content_fallback(MISTRAL, text)
