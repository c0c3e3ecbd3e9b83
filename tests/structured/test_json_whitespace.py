"""Whitespace between JSON tokens is bounded: walking only whitespace tokens (longest first, the
model's worst case) ends within MAX_WHITESPACE_RUN characters, after which only JSON remains."""

import llguidance as llg
import numpy as np
import pytest

from edged.structured import MAX_WHITESPACE_RUN, allocate_bitmask, constraint_from_request, new_matcher
from edged.structured.forms import Constraint
from edged.structured.matcher import GrammarMatcher

PREFIXES = ["", "{", '{"a":', '{"a": [1,', '{"a": 1', '{"a": {"b": true}']


def _ws_ids(t) -> np.ndarray:
    ids = [i for i, b in enumerate(t.bytes) if b and not b.strip(b" \t\n\r") and b[0] != 0xFF]
    # longest first, newline-heavy first: the worst a model could do
    ids.sort(key=lambda i: (-len(t.bytes[i]), -t.bytes[i].count(b"\n")))
    return np.array(ids, dtype=np.int64)


def _allowed_ids(m) -> np.ndarray:
    bm = allocate_bitmask(1, m.vocab_size)
    m.fill_mask(bm, 0)
    return np.flatnonzero(np.unpackbits(bm[0].view(np.uint8), bitorder="little")[: m.vocab_size])


def _ws_walk(t, m, max_steps: int = 40) -> int:
    """Consumes the worst allowed whitespace token while there is one; returns characters consumed."""
    ws = _ws_ids(t)
    total = 0
    for _ in range(max_steps):
        allowed = set(_allowed_ids(m).tolist())
        pick = next((int(i) for i in ws if int(i) in allowed), None)
        if pick is None:
            assert allowed, "nothing at all is allowed after the whitespace"
            return total
        assert m.consume(pick), m.error
        total += len(t.bytes[pick])
    return total


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("tok", ["gemma", "tiny_bpe"])
def test_whitespace_bounded(request, tok, prefix):
    t = request.getfixturevalue(tok)
    m = new_matcher(constraint_from_request({"response_format": {"type": "json_object"}}), t.ll)
    for b in t.byte_tokens(prefix.encode()):
        assert m.consume(b), m.error
    n = _ws_walk(t, m)
    assert n <= MAX_WHITESPACE_RUN
    if prefix == "{":
        assert n >= 2  # pretty-printing ("{\n  ...") stays possible
    assert not m.is_error()


def test_llguidance_default_is_unbounded(gemma):
    """The walk does detect a runaway: llguidance's own default whitespace lets it run on."""
    g = llg.LLMatcher.grammar_from_json_schema({"type": "object"})
    m = GrammarMatcher(llg.LLMatcher(gemma.ll, g, log_level=0), gemma.ll, Constraint(g, "x", "json_object"))
    assert m.consume(gemma.byte_id[b"{"])
    assert _ws_walk(gemma, m, max_steps=10) > 10 * MAX_WHITESPACE_RUN


def test_compact_has_no_whitespace(tiny_bpe):
    m = new_matcher(constraint_from_request(
        {"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}), tiny_bpe.ll)
    assert m.consume(tiny_bpe.byte_id[b"{"])
    assert _ws_walk(tiny_bpe, m) == 0
