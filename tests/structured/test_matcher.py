"""Matcher lifecycle: copy, preemption (state kept), rollback, errors that fail cleanly, and the
background MaskComputer against per-matcher masks; a masked greedy decode yields valid JSON."""

import json

import jsonschema
import numpy as np

from edged.structured import MaskComputer, allocate_bitmask, constraint_from_request, new_matcher

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def _matcher(t, schema=SCHEMA):
    return new_matcher(constraint_from_request({"json_schema": schema}), t.ll)


def _mask(m) -> np.ndarray:
    bm = allocate_bitmask(1, m.vocab_size)
    m.fill_mask(bm, 0)
    return bm[0].copy()


def _feed(m, ids):
    for i in ids:
        assert m.consume(i), m.error


def test_copy_forks_independently(gemma):
    m = _matcher(gemma)
    _feed(m, gemma.encode('{"name": "B'))
    c = m.copy()
    assert c.n_consumed == m.n_consumed
    _feed(m, gemma.encode('ob", "age": 1, "tags": []}'))
    _feed(c, gemma.encode('ill", "age": 99, "tags": ["a", "b"], "ok": true}'))
    assert m.is_stopped() and c.is_stopped() and m.is_accepting() and c.is_accepting()
    assert m.n_consumed != c.n_consumed


def test_preemption_keeps_state(gemma):
    """A preempted request resumes with the same matcher: its next mask equals a fresh matcher's
    fed the same tokens (what a recompute of the sequence would give)."""
    ids = gemma.encode('{"name": "Ann", "age": 3')
    m = _matcher(gemma)
    _feed(m, ids[:5])
    before = _mask(m)
    # ... preempted: KV freed, other requests run their own matchers meanwhile ...
    other = _matcher(gemma)
    _feed(other, gemma.encode('{"name": "Zed"'))
    assert np.array_equal(_mask(m), before)  # computing a mask does not advance the state
    _feed(m, ids[5:])
    fresh = _matcher(gemma)
    _feed(fresh, ids)
    assert np.array_equal(_mask(m), _mask(fresh))


def test_rollback(gemma):
    ids = gemma.encode('{"name": "Ann", "age": 3')
    m = _matcher(gemma)
    _feed(m, ids)
    assert m.rollback(3) and m.n_consumed == len(ids) - 3
    ref = _matcher(gemma)
    _feed(ref, ids[:-3])
    assert np.array_equal(_mask(m), _mask(ref))


def test_error_state_fails_cleanly(tiny_bpe):
    m = _matcher(tiny_bpe)
    assert not m.consume(tiny_bpe.byte_id[b"["])  # an object is required
    assert m.is_error() and m.error and m.is_stopped()
    assert not m.consume(tiny_bpe.byte_id[b"{"])  # stays failed, never raises
    _mask(m)
    batch = MaskComputer(m.vocab_size).compute(2, [(1, m)])
    assert 1 in batch.errors and batch.errors[1]


def test_mask_computer_matches_fill_mask(gemma):
    a, b = _matcher(gemma), _matcher(gemma)
    _feed(b, gemma.encode('{"name": "Jo", "age": 5, "tags": ['))
    mc = MaskComputer(a.vocab_size)
    try:
        fut = mc.submit(4, [(1, a), (3, b)])
        batch = fut.result(timeout=30)
    finally:
        mc.close()
    assert batch.rows.tolist() == [1, 3] and not batch.errors
    assert np.array_equal(batch.bitmask[1], _mask(a)) and np.array_equal(batch.bitmask[3], _mask(b))
    assert (batch.bitmask[[0, 2]] == -1).all()
    logits = np.random.default_rng(0).standard_normal((4, a.vocab_size)).astype(np.float32)
    orig = logits.copy()
    batch.apply(logits)
    assert np.array_equal(logits[[0, 2]], orig[[0, 2]])  # unconstrained rows untouched
    allowed_b = np.flatnonzero(np.isfinite(logits[3]))
    assert 0 < len(allowed_b) < 200
    for i in allowed_b:  # every token left finite is one the grammar takes next
        assert b.copy().consume(int(i)), gemma.bytes[i]
    for text in ("{", "1", "c"):
        assert not np.isfinite(logits[3, gemma.byte_tokens(text.encode())[0]])


def test_masked_greedy_decode_is_valid(gemma):
    """Random logits, masked, argmax, consume: always a document that validates."""
    rng = np.random.default_rng(7)
    for _ in range(3):
        m = _matcher(gemma)
        mc = MaskComputer(m.vocab_size)
        out = []
        for _step in range(200):
            batch = mc.compute(1, [(0, m)])
            assert not batch.errors
            logits = rng.standard_normal((1, m.vocab_size)).astype(np.float32)
            batch.apply(logits)
            tok = int(np.argmax(logits[0]))
            if tok in m.lltok.eos_tokens:
                assert m.is_accepting()
                break
            assert m.consume(tok), m.error
            out.append(tok)
            if m.is_stopped():
                break
        assert m.is_stopped()
        doc = json.loads(gemma.ll.decode_str(out))
        jsonschema.validate(doc, SCHEMA)
