"""Constraint data per format: every grammar compiles in llguidance, accepts the format's own
canonical calls (which the format's parser then reads back), and bounds the number of calls."""

import json
from functools import partial

import llguidance as llg
import pytest

from edged.toolcall import (GENERIC, HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS, OutputParser,
                            parse_tool_request)

from tests.toolcall.streamcheck import WEATHER

dumps = partial(json.dumps, ensure_ascii=False)  # the JSON grammar emits UTF-8, not \\u escapes

SPECIALS = ["<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "<tool_call>", "</tool_call>"]
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["q"]}}}


class ByteVocab:
    """A byte-level vocabulary plus the format literals as special tokens, for llguidance."""
    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)]
        self.tokens += [b"\xff" + s.encode() for s in SPECIALS] + [b"\xff<eos>"]
        self.eos_token_id, self.bos_token_id = len(self.tokens) - 1, None
        self.special_token_ids = list(range(256, len(self.tokens)))

    def __call__(self, data):
        return list(data)


TOKENIZER = llg.LLTokenizer(llg.TokenizerWrapper(ByteVocab()))


def token_ref(text):
    return f"<[{256 + SPECIALS.index(text)}]>" if text in SPECIALS else None


def encode(text):
    """Bytes, with each special literal as its one token."""
    ids, i = [], 0
    while i < len(text):
        for s in SPECIALS:
            if text.startswith(s, i):
                ids.append(256 + SPECIALS.index(s))
                i += len(s)
                break
        else:
            ids += list(text[i].encode())
            i += 1
    return ids


def accepts(spec, text):
    m = llg.LLMatcher(TOKENIZER, llg.LLMatcher.grammar_from_lark(spec.grammar_text()))
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(encode(text)) and m.is_accepting()


def hermes_call(name, args):
    return "<tool_call>\n" + dumps({"name": name, "arguments": args}) + "\n</tool_call>"


CANONICAL = {
    "hermes": lambda calls: "\n".join(hermes_call(n, a) for n, a in calls),
    "mistral": lambda calls: "[TOOL_CALLS]" + dumps(
        [{"name": n, "arguments": a} for n, a in calls]),
    "mistral-args": lambda calls: "".join(f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}" for n, a in calls),
    "llama3": lambda calls: dumps({"name": calls[0][0], "parameters": calls[0][1]}),
    "generic": lambda calls: dumps({"tool_calls": [{"name": n, "arguments": a}
                                                        for n, a in calls]}),
}
FORMATS = [HERMES, MISTRAL, MISTRAL_ARGS, LLAMA3, GENERIC]
ONE = [("get_weather", {"city": "Z\u00fcrich"})]
TWO = ONE + [("search", {"q": "caf\u00e9 \"x\"", "n": 3})]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("choice", ["required", "auto",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_grammar_accepts_one_canonical_call_and_parser_reads_it(fmt, choice):
    req = parse_tool_request([WEATHER, SEARCH], choice, parallel_tool_calls=False)
    spec = fmt.constraint(req, token_ref)
    text = CANONICAL[fmt.name](ONE)
    assert accepts(spec, text)
    assert not accepts(spec, CANONICAL[fmt.name]([("get_weather", {"town": "x"})]))
    msg = OutputParser(fmt, req).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == ONE
    assert spec.lazy == (choice == "auto" and fmt is not GENERIC)
    if spec.lazy:
        assert spec.triggers and all(text.startswith(t.text) for t in spec.triggers)


@pytest.mark.parametrize("fmt", [HERMES, MISTRAL, MISTRAL_ARGS, GENERIC], ids=lambda f: f.name)
def test_parallel_bounds(fmt):
    text = CANONICAL[fmt.name](TWO)
    parallel = fmt.constraint(parse_tool_request([WEATHER, SEARCH], "required", True), token_ref)
    single = fmt.constraint(parse_tool_request([WEATHER, SEARCH], "required", False), token_ref)
    assert accepts(parallel, text) and not accepts(single, text)


def test_named_function_excludes_others():
    req = parse_tool_request([WEATHER, SEARCH], {"type": "function", "function": {"name": "search"}})
    for fmt in FORMATS:
        spec = fmt.constraint(req, token_ref)
        assert not accepts(spec, CANONICAL[fmt.name](ONE)), fmt.name


def test_generic_auto_allows_a_response_required_does_not():
    auto = GENERIC.constraint(parse_tool_request([WEATHER], "auto"))
    required = GENERIC.constraint(parse_tool_request([WEATHER], "required"))
    reply = dumps({"response": "Hello!"})
    assert accepts(auto, reply) and not accepts(required, reply)
    assert auto.kind == "json_schema" and not auto.lazy


def test_none_and_no_tools_give_no_constraint():
    for fmt in FORMATS:
        assert fmt.constraint(parse_tool_request([WEATHER], "none")) is None
        assert fmt.constraint(parse_tool_request(None)) is None


def test_llama_trigger_only_at_start():
    spec = LLAMA3.constraint(parse_tool_request([WEATHER], "auto"))
    assert [(t.text, t.at_start) for t in spec.triggers] == [("{", True)]
