"""Every request form compiles; a valid document is accepted token by token, an invalid one is
rejected at the byte where it goes wrong; EOS is allowed only once the grammar accepts."""

import json

import numpy as np
import pytest

from edged.structured import allocate_bitmask, constraint_from_request, new_matcher

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
GBNF = 'root ::= ("yes" | "no") " " [0-9]+'
LARK = 'start: "id=" NUM\nNUM: /[0-9]{1,3}/'

# (request body, valid output, invalid output, the invalid output's first bad byte)
CASES = {
    "response_format.json_object": ({"response_format": {"type": "json_object"}},
                                    '{"a": [1, true, null], "b": {"c": "d"}}', '{"a" 1}', 5),
    "response_format.json_schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}}},
        '{"name": "Bob", "age": 42, "tags": ["x"]}', '{"name": "Bob", "age": -1}', 23),
    "response_format.json_schema extra key": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON}}}, '{"name":"Bo","age":0}', '{"name": "Bo", "email"', 16),
    "json_schema": ({"json_schema": {"enum": ["red", "green"]}}, '"green"', '"blue"', 1),
    "grammar.gbnf": ({"grammar": GBNF}, "no 42", "maybe", 0),
    "grammar.lark": ({"grammar": LARK}, "id=7", "id=x", 3),
    "structured_outputs.json": ({"structured_outputs": {"json": PERSON}}, '{"name": "A", "age": 1}',
                                '{"age": 1}', 2),
    "structured_outputs.json string": ({"structured_outputs": {"json": json.dumps({"type": "integer"})}},
                                       "-12", "1.5", 1),
    "structured_outputs.regex": ({"structured_outputs": {"regex": r"[a-z]+@[a-z]+\.com"}}, "me@x.com", "me@x.org", 5),
    "structured_outputs.choice": ({"structured_outputs": {"choice": ["positive", "negative"]}}, "negative",
                                  "neutral", 2),
    "structured_outputs.grammar": ({"structured_outputs": {"grammar": GBNF}}, "yes 1", "yes x", 4),
    "structured_outputs.json_object": ({"structured_outputs": {"json_object": True}}, "{}", "[]", 0),
    "guided_choice": ({"guided_choice": ["a b", "c"]}, "a b", "a c", 2),
    "guided_json": ({"guided_json": {"type": "boolean"}}, "true", "tru3", 3),
}


def _allowed(m, token: int) -> bool:
    bm = allocate_bitmask(1, m.vocab_size)
    m.fill_mask(bm, 0)
    return bool((int(bm[0, token >> 5]) >> (token & 31)) & 1)


def _eos_allowed(m) -> bool:
    return any(_allowed(m, e) for e in m.lltok.eos_tokens)


@pytest.mark.parametrize("name", CASES)
def test_valid_accepted(tiny_bpe, name):
    body, valid, _, _ = CASES[name]
    m = new_matcher(constraint_from_request(body), tiny_bpe.ll)
    for t in tiny_bpe.byte_tokens(valid.encode()):
        assert _eos_allowed(m) == m.is_accepting()
        assert _allowed(m, t)
        assert m.consume(t), m.error
    assert m.is_accepting() and _eos_allowed(m)
    assert m.consume(tiny_bpe.ll.eos_tokens[0]) and m.is_stopped()


@pytest.mark.parametrize("name", CASES)
def test_invalid_rejected_at_byte(tiny_bpe, name):
    body, _, invalid, bad = CASES[name]
    m = new_matcher(constraint_from_request(body), tiny_bpe.ll)
    toks = tiny_bpe.byte_tokens(invalid.encode())
    for t in toks[:bad]:
        assert m.consume(t), m.error
    assert not _allowed(m, toks[bad])
    assert not m.consume(toks[bad])
    assert m.is_error() and m.error


@pytest.mark.parametrize("name", ["response_format.json_schema", "structured_outputs.json", "grammar.gbnf",
                                  "structured_outputs.choice", "structured_outputs.regex"])
def test_model_tokenization_accepted(gemma, name):
    """The default model's own tokens for a valid document pass, and EOS comes only at the end."""
    body, valid, _, _ = CASES[name]
    m = new_matcher(constraint_from_request(body), gemma.ll)
    ids = gemma.encode(valid)
    assert len(ids) < len(valid)  # multi-byte tokens, not bytes
    for i, t in enumerate(ids):
        assert _eos_allowed(m) == m.is_accepting()
        assert i == 0 or not m.is_stopped()
        assert m.consume(t), m.error
    assert _eos_allowed(m) and m.is_accepting()


def test_unconstrained_forms():
    assert constraint_from_request({}) is None
    assert constraint_from_request({"response_format": {"type": "text"}}) is None
    assert constraint_from_request({"grammar": "", "structured_outputs": {"backend": "guidance"}}) is None


def test_regex_is_full_match(tiny_bpe):
    m = new_matcher(constraint_from_request({"structured_outputs": {"regex": "ab+"}}), tiny_bpe.ll)
    for t in tiny_bpe.byte_tokens(b"ab"):
        assert m.consume(t)
    assert m.is_accepting() and not m.is_stopped()  # more b's may follow
    assert _allowed(m, tiny_bpe.byte_id[b"b"]) and not _allowed(m, tiny_bpe.byte_id[b"a"])


def test_choice_escapes(tiny_bpe):
    choices = ['say "hi"', "back\\slash", "é\n"]
    for c in choices:
        m = new_matcher(constraint_from_request({"structured_outputs": {"choice": choices}}), tiny_bpe.ll)
        for t in tiny_bpe.byte_tokens(c.encode()):
            assert m.consume(t), (c, m.error)
        assert m.is_stopped() and _eos_allowed(m)


def test_mask_counts_shrink(gemma):
    """Inside a string most of the vocabulary is allowed; at a key, almost nothing."""
    m = new_matcher(constraint_from_request({"json_schema": PERSON}), gemma.ll)
    bm = allocate_bitmask(1, m.vocab_size)
    m.fill_mask(bm, 0)
    first = int(np.unpackbits(bm.view(np.uint8)).sum())
    for t in gemma.encode('{"name": "'):
        assert m.consume(t)
    m.fill_mask(bm, 0)
    inside = int(np.unpackbits(bm.view(np.uint8)).sum())
    assert first < 50 and inside > 200_000
