"""gpt-oss's harmony replies (edged/toolcall/harmony.py) parsed from hand-written text: reasoning
(the analysis channel), content (final, preambles) and tool calls in both header forms; streamed
at every split equal to the whole parse; what stays content; the tools grammar; detection from a
gpt-oss-style template and its rendering through edged.chat."""

import json

import llguidance as llg
import pytest

from edged.chat import ChatTemplate
from edged.toolcall import (HARMONY, HARMONY_REASONING, OutputParser, detect_reasoning, detect_tool_format,
                            opens_in_reasoning, parse_tool_request)
from tests.helpers.harmony_template import HARMONY_CHAT_TEMPLATE
from tests.toolcall.streamcheck import NESTED_ARGS, NESTED_JSON_UTF8, REQUEST, WEATHER, assert_stream_matches, stream

THINK = "<|channel|>analysis<|message|>The user wants the weather. Use get_weather.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 21 \u00b0C in Paris.<|end|>"
CALL_A = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
CALL_B = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'


def parse(text, request=REQUEST, reasoning=HARMONY_REASONING):
    return assert_stream_matches(HARMONY, text, request, reasoning)


def test_reasoning_and_answer():
    msg = parse(THINK + FINAL)
    assert msg.reasoning_content == "The user wants the weather. Use get_weather."
    assert msg.content == "It is 21 \u00b0C in Paris." and msg.tool_calls == []
    # the reply of a prompt that ends with <|start|>assistant may also skip the analysis
    assert parse("<|channel|>final<|message|>Hi!").content == "Hi!"


@pytest.mark.parametrize("call", [CALL_A, CALL_B], ids=["channel_first", "recipient_first"])
def test_tool_call_after_analysis(call):
    msg = parse(THINK + call)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert msg.content == "" and msg.reasoning_content.startswith("The user wants")
    assert msg.finish_reason == "tool_calls"


def test_preamble_is_content_and_nested_arguments():
    preamble = "<|start|>assistant<|channel|>commentary<|message|>Let me search.<|end|>"
    call = f"<|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{NESTED_JSON_UTF8}"
    msg = parse(THINK + preamble + call)
    assert msg.content == "Let me search."
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("search", NESTED_ARGS)]


@pytest.mark.parametrize("body", [
    '<|channel|>commentary to=functions.send_mail <|constrain|>json<|message|>{"to": "x"}',  # not offered
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>Paris",  # not JSON
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>["Paris"]',  # not an object
    '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "x"}',  # a built-in tool
])
def test_what_is_not_a_call_stays_content(body):
    msg = OutputParser(HARMONY, REQUEST, HARMONY_REASONING).parse(body)
    assert msg.tool_calls == [] and msg.content == body.split("<|message|>")[1]
    _, streamed, _ = stream(HARMONY, list(body), REQUEST, HARMONY_REASONING)
    assert streamed.tool_calls == [] and streamed.content == msg.content


def test_without_tools_or_reasoning_split():
    text = THINK + CALL_A
    no_tools = parse(text, request=None)  # a call without a tool request is text
    assert no_tools.tool_calls == [] and no_tools.content == '{"city": "Paris"}'
    no_split = parse(THINK + FINAL, reasoning=None)  # --reasoning-format none: the analysis is content
    assert no_split.reasoning_content is None
    assert no_split.content == "The user wants the weather. Use get_weather.\nIt is 21 \u00b0C in Paris."


def test_text_without_headers_is_content():
    assert parse("Just an answer, no channels.").content == "Just an answer, no channels."
    cut = parse("<|channel|>analysis<|message|>thinking, cut off by max_tokens")
    assert cut.reasoning_content == "thinking, cut off by max_tokens" and cut.content == ""
    assert parse("<|channel|>fin").content == ""  # the output ended inside a header


def test_streaming_holds_back_a_partial_marker():
    p = OutputParser(HARMONY, REQUEST, HARMONY_REASONING)
    got = p.feed("<|channel|>final<|message|>Hello<|en")
    assert [d.content for d in got] == ["Hello"]
    assert p.feed("d|>") == []
    assert p.feed(" <|start|>assistant<|chan") == []


def test_detection_and_rendering():
    assert detect_tool_format(HARMONY_CHAT_TEMPLATE) is HARMONY
    assert detect_reasoning(HARMONY_CHAT_TEMPLATE) is HARMONY_REASONING
    assert opens_in_reasoning("<|start|>assistant", HARMONY_REASONING)
    chat = ChatTemplate(HARMONY_CHAT_TEMPLATE, "gguf")
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "thinking": "Use the tool.",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    text = chat.render(history, tools=[WEATHER])
    assert text.startswith("<|start|>system<|message|>") and text.endswith("<|end|><|start|>assistant")
    assert "# Instructions\n\nBe brief." in text and "type get_weather = (_: {\ncity: string," in text
    assert ('<|start|>assistant<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant '
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>') in text
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"21 C"<|end|>' in text


# --- the tools grammar ----------------------------------------------------------------------------
SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"]


class ByteVocab:
    """Bytes plus harmony's markers as special tokens (they are single tokens in gpt-oss)."""

    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff" + s.encode() for s in SPECIALS] + [b"\xff<eos>"]
        self.eos_token_id, self.bos_token_id = len(self.tokens) - 1, None
        self.special_token_ids = list(range(256, len(self.tokens)))

    def __call__(self, data):
        return list(data)


TOKENIZER = llg.LLTokenizer(llg.TokenizerWrapper(ByteVocab()))


def token_ref(text):
    return f"<[{256 + SPECIALS.index(text)}]>" if text in SPECIALS else None


def accepts(spec, text):
    ids, i = [], 0
    while i < len(text):
        hit = next((s for s in SPECIALS if text.startswith(s, i)), None)
        ids += [256 + SPECIALS.index(hit)] if hit else list(text[i].encode())
        i += len(hit) if hit else 1
    m = llg.LLMatcher(TOKENIZER, llg.LLMatcher.grammar_from_lark(spec.grammar_text()))
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(ids) and m.is_accepting()


def test_auto_grammar_is_lazy_from_the_recipient():
    req = parse_tool_request([WEATHER], "auto")
    spec = HARMONY.constraint(req, token_ref)
    assert spec.lazy and [t.text for t in spec.triggers] == ["to=functions."]
    for call in (CALL_A, CALL_B):
        assert accepts(spec, call[call.index("to=functions."):])
    assert not accepts(spec, 'to=functions.get_weather <|constrain|>json<|message|>{"town": "x"}')
    assert not accepts(spec, 'to=functions.search <|constrain|>json<|message|>{"city": "x"}')


def test_required_grammar_allows_analysis_first():
    spec = HARMONY.constraint(parse_tool_request([WEATHER], "required"), token_ref)
    assert not spec.lazy
    first_call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    assert accepts(spec, first_call)
    assert accepts(spec, THINK + "<|start|>assistant" + first_call)
    assert accepts(spec, ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}')
    assert not accepts(spec, "<|channel|>final<|message|>It is sunny.")
    msg = OutputParser(HARMONY, parse_tool_request([WEATHER], "required"), HARMONY_REASONING).parse(
        THINK + "<|start|>assistant" + first_call)
    assert [c.name for c in msg.tool_calls] == ["get_weather"]
