"""Constrained decoding in the engine on a tiny random byte-level model: outputs validate, the
unconstrained rows of a mixed batch get exactly their tokens alone, preemption keeps the matcher,
max_tokens mid-structure is "length", a failing matcher fails only its request."""

import json

import jsonschema
import llguidance as llg
import pytest

from edged.engine.constraint import ACTIVE, LAZY, OFF, THINKING, ModelGrammars, RequestConstraint
from edged.sampling import SamplingParams
from edged.structured import Constraint, schema_constraint
from tests.engine.engine_helpers import (assert_all_blocks_free, assert_preempted_equal, greedy, load_tiny,
                                         random_prompts, start_engine, token_ids)

SCHEMA = {"type": "object",
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tag": {"enum": ["red", "green", "blue"]},
                         "ok": {"type": "boolean"}},
          "required": ["n", "tag", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("tiny"), "qwen2")


@pytest.fixture(scope="module")
def grammars(tiny):
    model, tok = tiny
    return ModelGrammars(tok, model.vocab_size)


def _constraint(grammars, schema=SCHEMA):
    return grammars.request_constraint(schema_constraint(schema, "response_format"))


def _params(n=60, **kw):
    return SamplingParams(**{"temperature": 0.0, "max_tokens": n, **kw})


def _text(tok, deltas):
    return "".join(d.text for d in deltas)


def test_constrained_output_validates(tiny, grammars):
    eng = start_engine(tiny)
    try:
        for seed, p in enumerate(random_prompts(tiny[0].vocab_size, n=4, seed=3)):
            params = _params(temperature=0.8, seed=seed) if seed % 2 else _params()
            deltas = list(eng.add_request(p, params, constraint=_constraint(grammars)))
            assert deltas[-1].finish_reason == "stop", deltas[-1]
            jsonschema.validate(json.loads(_text(tiny[1], deltas)), SCHEMA)
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_mixed_batch_leaves_unconstrained_tokens_identical(tiny, grammars):
    prompts = random_prompts(tiny[0].vocab_size, n=6, seed=5)
    eng = start_engine(tiny)
    try:
        alone = [token_ids(eng.generate(p, greedy(10))) for p in prompts[:3]]
        streams = []
        for i, p in enumerate(prompts):
            if i < 3:
                streams.append(eng.add_request(p, greedy(10)))
            else:
                streams.append(eng.add_request(p, _params(), constraint=_constraint(grammars)))
        results = [list(s) for s in streams]
        assert [token_ids(r) for r in results[:3]] == alone
        for r in results[3:]:
            jsonschema.validate(json.loads(_text(tiny[1], r)), SCHEMA)
        assert eng.masks.timings  # masks were computed (on the worker thread)
    finally:
        eng.stop()


def test_preemption_keeps_the_matcher(tiny, grammars):
    prompts = random_prompts(tiny[0].vocab_size, n=6, seed=1)
    big = start_engine(tiny)
    small = start_engine(tiny, num_blocks=24, max_batch_tokens=16)
    try:
        assert_preempted_equal(big, small, prompts,
                               lambda e, p: e.add_request(p, _params(14), constraint=_constraint(grammars)))
    finally:
        big.stop()
        small.stop()


def test_max_tokens_mid_structure_is_length(tiny, grammars):
    eng = start_engine(tiny)
    try:
        deltas = list(eng.add_request([5, 6, 7], _params(3), constraint=_constraint(grammars)))
        assert deltas[-1].finish_reason == "length"
        assert _text(tiny[1], deltas).startswith("{")
    finally:
        eng.stop()


def test_failing_matcher_fails_only_its_request(tiny, grammars):
    eng = start_engine(tiny)
    bad = _constraint(grammars)
    bad.matcher.consume = lambda token: False  # the grammar rejects whatever is sampled
    try:
        alone = token_ids(eng.generate([9, 10, 11], greedy(8)))
        s_bad = eng.add_request([5, 6, 7], _params(), constraint=bad)
        s_ok = eng.add_request([9, 10, 11], greedy(8))
        s_c = eng.add_request([12, 13], _params(), constraint=_constraint(grammars))
        d_bad, d_ok, d_c = list(s_bad), list(s_ok), list(s_c)
        assert d_bad[-1].finish_reason == "error" and "constraint" in d_bad[-1].error
        assert token_ids(d_ok) == alone
        jsonschema.validate(json.loads(_text(tiny[1], d_c)), SCHEMA)
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_n_copies_are_independent(tiny, grammars):
    eng = start_engine(tiny)
    try:
        first = _constraint(grammars)
        copies = [first] + [first.copy() for _ in range(2)]
        streams = [eng.add_request([5, 6, 7], _params(temperature=1.0, seed=i), constraint=c)
                   for i, c in enumerate(copies)]
        for s in streams:
            jsonschema.validate(json.loads(_text(tiny[1], list(s))), SCHEMA)
    finally:
        eng.stop()


# -- phases, fed token by token -----------------------------------------------------------------

def _feed(c, grammars, text):
    for t in grammars.encode(text.encode()):
        assert c.consume(t), c.error


def _lazy(grammars):
    lark = llg.LLMatcher.grammar_from_lark('start: "<call>" %json {"type": "object"}')
    return grammars.request_constraint(Constraint(lark, "tools", "grammar"),
                                       triggers=[grammars.trigger("<call>")])


def test_lazy_trigger_switches_the_grammar_on(grammars):
    c = _lazy(grammars)
    assert c.phase == LAZY and not c.masking
    _feed(c, grammars, "Let me look that up. <ca")
    assert c.phase == LAZY
    _feed(c, grammars, 'll>{"a"')
    assert c.phase == ACTIVE and c.masking and c.matcher.n_consumed > 0


def test_lazy_trigger_rejected_turns_off(grammars):
    # one token holding the trigger and text the grammar rejects: the constraint turns off
    lazy = _lazy(grammars)
    c = RequestConstraint(lazy.matcher, lambda t: b"text <call>not json", grammars.encode,
                          triggers=lazy.triggers)
    assert c.consume(0)
    assert c.phase == OFF and not c.masking


def test_constraint_starts_after_reasoning(grammars):
    c = grammars.request_constraint(schema_constraint(SCHEMA, "response_format"),
                                    start_after="</think>", starts_in_reasoning=True)
    assert c.phase == THINKING and not c.masking
    _feed(c, grammars, "hmm, the answer is { not json </thi")
    assert c.phase == THINKING
    _feed(c, grammars, 'nk>')
    assert c.phase == ACTIVE and c.matcher.n_consumed == 0
    _feed(c, grammars, '{"n": 1')
    assert c.phase == ACTIVE and c.matcher.n_consumed > 0
