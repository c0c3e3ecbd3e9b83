"""Reasoning split, complete and streamed, alone and before tool calls."""

import pytest

from edged.toolcall import GENERIC, HERMES, THINK, parse_output, split_reasoning

from tests.toolcall.streamcheck import REQUEST, assert_stream_matches

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_split_complete():
    assert split_reasoning("<think>\nhmm\n</think>\n\nHi", THINK, False, True) == ("hmm", "\n\nHi")
    assert split_reasoning("Hi <think>x</think>", THINK, False, True) == (None, "Hi <think>x</think>")
    assert split_reasoning("hmm</think>Hi", THINK, True, True) == ("hmm", "Hi")
    assert split_reasoning("still thinking", THINK, True, True) == ("still thinking", "")


@pytest.mark.parametrize("text, inside, reasoning, content", [
    ("<think>\nLet me think: 2+2 \u2248 4 \U0001F914\n</think>\n\nIt is 4.", False,
     "Let me think: 2+2 \u2248 4 \U0001F914", "It is 4."),
    ("  <think>a < b</think>ok", False, "a < b", "ok"),
    ("Plain answer, <think> later.", False, None, "Plain answer, <think> later."),
    ("<thin", False, None, "<thin"),
    ("The user wants x.\n</think>\n\nAnswer.", True, "The user wants x.", "Answer."),
    ("cut off mid-thought </thi", True, "cut off mid-thought </thi", ""),
])
def test_reasoning_stream_matches_complete(text, inside, reasoning, content):
    msg = assert_stream_matches(None, text, request=None, reasoning=THINK, starts_inside=inside)
    assert msg.reasoning_content == reasoning and msg.content == content


def test_reasoning_then_tool_call():
    text = "<think>\nNeed the weather.\n</think>\n\nChecking.\n" + CALL
    msg = assert_stream_matches(HERMES, text, reasoning=THINK)
    assert msg.reasoning_content == "Need the weather." and msg.content == "Checking."
    assert msg.tool_calls[0].name == "get_weather"
    # A call written inside the thinking is not a call.
    msg = parse_output("<think>" + CALL + "</think>Done", HERMES, REQUEST, THINK)
    assert msg.tool_calls == [] and msg.content == "Done"


def test_reasoning_format_none_keeps_think_text():
    msg = parse_output("<think>x</think>y", GENERIC, None, None)
    assert msg.content == "<think>x</think>y" and msg.reasoning_content is None
