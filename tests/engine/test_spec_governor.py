"""The speculation governor (edged.engine.spec_governor): per batch size it drafts where decode
steps with drafts yielded more tokens a second, keeps trying the other way, follows a change; in
the engine it is asked only about decode-only steps, and what it decides never changes outputs."""

import pytest

from edged.engine.engine import Engine, EngineConfig
from edged.engine.spec_governor import EXPLORE_EVERY, SpecGovernor
from tests.engine.engine_helpers import greedy, start_engine, token_ids
from tests.engine.test_spec_ngram import _chain, stub  # noqa: F401 (a fixture)


def _drive(gov: SpecGovernor, batch: int, plain: tuple, spec: tuple, steps: int) -> list[bool]:
    """Run `steps` decisions at `batch`, each step yielding (tokens, seconds) = plain or spec."""
    out = []
    for _ in range(steps):
        d = gov.drafting(batch)
        gov.record(batch, d, *(spec if d else plain))
        out.append(d)
    return out


def test_drafts_where_drafting_is_faster_and_not_where_it_is_slower():
    gov = SpecGovernor()
    one = _drive(gov, 1, plain=(1, 0.010), spec=(3, 0.012), steps=256)[8:]  # 2.5x with drafts
    four = _drive(gov, 4, plain=(4, 0.020), spec=(4.4, 0.030), steps=256)[8:]  # 0.73x with drafts
    assert sum(one) >= 0.97 * len(one) and not any(four)
    # drafting, it still tries a step without now and then (rarely: the gap is wide)
    assert 1 <= len(one) - sum(one) <= len(one) // (4 * EXPLORE_EVERY) + 1
    p1, s1 = gov.rates()[1]
    assert s1 == pytest.approx(250.0) and p1 == pytest.approx(100.0)
    # not drafting, it tries drafts more rarely the more sequences a try's catch-up reads: a try
    # is the catch-up step, not counted, then the step measured
    every = 4 * EXPLORE_EVERY * 4  # wide gap, 4 sequences
    later = _drive(gov, 4, plain=(4, 0.020), spec=(4.4, 0.030), steps=3 * every)
    assert sum(later) == 2 * 3
    wide = _drive(gov, 64, plain=(64, 0.05), spec=(64, 0.10), steps=3 * every + 64)[16:]
    assert sum(wide) == 0  # 64 sequences: a try every 4 * EXPLORE_EVERY * TRY_DRAFTS_FACTOR steps


def test_one_slow_step_does_not_decide():
    gov = SpecGovernor()
    gov.record(1, True, 3, 1.0)  # the first drafting step hit a page fault (or a busy neighbour)
    choices = _drive(gov, 1, plain=(1, 0.010), spec=(3, 0.012), steps=64)
    assert sum(choices[8:]) >= len(choices[8:]) - 1


def test_follows_a_change_of_the_faster_way():
    gov = SpecGovernor()
    before = _drive(gov, 4, plain=(4, 0.020), spec=(4.4, 0.030), steps=64)
    after = _drive(gov, 4, plain=(4, 0.020), spec=(8, 0.024), steps=4 * EXPLORE_EVERY * 4 + 64)
    assert not any(before[-8:])
    assert sum(after[-64:]) >= 62  # drafts now pay (1.67x): one try showed it


def test_a_batch_size_follows_the_measured_ones():
    gov = SpecGovernor()
    _drive(gov, 4, plain=(4, 0.02), spec=(4.4, 0.04), steps=16)  # drafts cost at 4
    assert not any(_drive(gov, 6, plain=(6, 0.02), spec=(30, 0.02), steps=8))  # so at 6, untried
    tried = _drive(gov, 2, plain=(2, 0.02), spec=(2.2, 0.04), steps=16)  # 2: nothing says, so tried
    assert tried[0] and sum(tried) >= 2 and not any(tried[-8:])

    gov = SpecGovernor()
    _drive(gov, 4, plain=(4, 0.02), spec=(12, 0.03), steps=16)  # drafts pay at 4
    assert all(_drive(gov, 2, plain=(2, 0.01), spec=(2, 0.05), steps=8))  # so at 2, untried
    assert not all(_drive(gov, 6, plain=(6, 0.02), spec=(6.6, 0.04), steps=16))  # 6: tried


def test_unmeasured_steps_follow_the_figures_and_change_nothing():
    gov = SpecGovernor()
    assert gov.prefers_drafts(4)  # nothing says otherwise
    _drive(gov, 4, plain=(4, 0.02), spec=(4.4, 0.04), steps=16)  # drafts cost at 4
    before = (gov.skipped, gov.rates())
    assert [gov.prefers_drafts(b) for b in (2, 4, 6)] == [True, False, False]
    assert (gov.skipped, gov.rates()) == before
    assert not any(_drive(gov, 4, plain=(4, 0.02), spec=(4.4, 0.04), steps=16))


def test_batch_sizes_keep_their_own_figures():
    gov = SpecGovernor()
    seen = {1: [], 2: []}
    for i in range(200):  # interleaved: drafting pays at 1, costs at 2... measured at 1 first
        b = 1 + (i % 2 if i >= 8 else 0)
        d = gov.drafting(b)
        gov.record(b, d, *(((3, 0.01) if d else (1, 0.01)) if b == 1 else ((2.2, 0.02) if d else (2, 0.01))))
        seen[b].append(d)
    assert sum(seen[1][8:]) > 0.9 * len(seen[1][8:]) and sum(seen[2][8:]) < 0.2 * len(seen[2][8:])


def test_bad_settings():
    with pytest.raises(ValueError, match="explore_every"):
        SpecGovernor(explore_every=1)
    with pytest.raises(ValueError, match="settle"):
        SpecGovernor(settle=0)


class _OnlyAlone(SpecGovernor):
    """A governor that drafts only for a lone sequence, and keeps what it is told."""

    def __init__(self):
        super().__init__()
        self.records = []

    def drafting(self, batch):
        return batch == 1

    def prefers_drafts(self, batch):
        return batch == 1

    def record(self, batch, drafted, tokens, seconds):
        self.records.append((batch, drafted, tokens, seconds))


def test_engine_asks_only_about_decode_steps_and_outputs_do_not_change(stub):  # noqa: F811
    model, _ = stub
    prompts = [_chain(model, s, 24) for s in (9, 40, 77)]  # cycles: every later token is drafted
    lengths = (6, 14, 40)  # the last one decodes alone at the end
    plain = start_engine(stub, max_batch_tokens=128)
    spec = start_engine(stub, max_batch_tokens=128, spec="ngram", spec_max=4)  # prompts in one step
    try:
        gov = spec.governor = _OnlyAlone()  # the engine asks any governor it has
        ref = [token_ids(plain.generate(p, greedy(n))) for p, n in zip(prompts, lengths)]
        streams = [spec.add_request(p, greedy(n)) for p, n in zip(prompts, lengths)]
        assert [token_ids(list(s)) for s in streams] == ref
        assert gov.records and all(s > 0 for *_, s in gov.records)
        wide = [r for r in gov.records if r[0] > 1]
        alone = [r for r in gov.records if r[0] == 1]
        assert wide and all(not d and t == b for b, d, t, _ in wide)  # no drafts: a token each
        assert alone and all(d for _, d, _, _ in alone) and max(t for _, _, t, _ in alone) > 1
        assert spec.stats().spec_accepted_tokens == sum(t - b for b, _, t, _ in gov.records)
    finally:
        plain.stop()
        spec.stop()


def test_only_a_draft_model_is_governed_and_spec_always_turns_it_off(stub):  # noqa: F811
    model, tok = stub
    for kw, governed in (({"spec": "ngram"}, False), ({"spec": "draft"}, True),
                         ({"spec": "draft", "spec_adaptive": False}, False)):
        eng = Engine(model, tok, EngineConfig(num_blocks=64, block_size=4, **kw),
                     draft=model if kw["spec"] == "draft" else None)
        try:
            assert (eng.governor is not None) == governed, kw
            assert eng.stats().spec_skipped_steps == 0
        finally:
            eng.stop()
