"""Prompt log-probabilities computed in the prefill pass (issue 16 item 4): equal to a teacher-forced
all-rows forward, first entry None, chunked under the per-step row limit, with the prefix cache
on, after a preemption, batch-invariant, and max_tokens 0 as a prefill-only request."""

import numpy as np
import pytest

from edged.engine.prompt_logprobs import max_scored_rows
from edged.sampling import SamplingParams
from tests.engine.engine_helpers import assert_all_blocks_free, greedy, load_tiny, start_engine, token_ids
from tests.models.driver import Seq, ShuffledBlocks, log_softmax, make_batch

PROMPT = list(range(5, 48))  # 43 tokens: several 4-token blocks and, at 16 rows a step, 3 chunks


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def tiny(request, tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("m"), request.param)


def teacher_forced(model, prompt) -> np.ndarray:
    """float64 [len(prompt), vocab] log-softmax of every row of one all-logits forward."""
    n_blocks = -(-len(prompt) // 4)
    kv = model.allocate_kv(n_blocks, 4)
    batch = make_batch([Seq()], [prompt], ShuffledBlocks(n_blocks), 4, all_logits=True)
    return log_softmax(model.forward(batch, kv))


def scored(k=3, n=0, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, prompt_logprobs=k, **kw)


def prompt_logprobs(deltas):
    """The prompt logprobs a request's deltas carried (exactly one delta has them)."""
    carried = [d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None]
    assert len(carried) == 1, deltas
    return carried[0]


def as_tuples(entries):
    return [None if e is None else (e.logprob, e.rank, e.top) for e in entries]


def test_equal_to_teacher_forced_forward(tiny):
    model, _ = tiny
    ref = teacher_forced(model, PROMPT)
    eng = start_engine(tiny, max_scored_rows=16)
    try:
        deltas = eng.generate(PROMPT, scored(k=3))
        assert deltas[-1].finish_reason == "length" and deltas[-1].token_id is None
        assert len(deltas) == 1 and deltas[-1].num_output_tokens == 0
        entries = prompt_logprobs(deltas)
        assert len(entries) == len(PROMPT) and entries[0] is None
        for p in range(1, len(PROMPT)):
            row, e = ref[p - 1], entries[p]
            assert e.logprob == pytest.approx(row[PROMPT[p]], abs=1e-4)
            assert e.rank == 1 + int(np.sum(row > row[PROMPT[p]]))
            assert [t for t, _ in e.top] == list(np.argsort(-row, kind="stable")[:3])
            assert [lp for _, lp in e.top] == pytest.approx(np.sort(row)[::-1][:3], abs=1e-4)
        assert eng.stats().steps >= 3  # 43 scored rows at 16 a step
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_with_generation_and_prefix_cache(tiny):
    """A scored request after the same prompt was cached: it recomputes every position (no prefix
    hit), gets the same scores, and its generated tokens equal an unscored run's; the scores ride
    on the first token's delta."""
    eng = start_engine(tiny, max_scored_rows=16)
    try:
        plain = token_ids(eng.generate(PROMPT, greedy(5)))
        hits = eng.kv.prefix_hits
        first = eng.generate(PROMPT, scored(k=2, n=5))
        assert eng.kv.prefix_hits == hits  # the cached blocks were not used for scored positions
        assert token_ids(first) == plain
        assert first[0].token_id is not None and first[0].prompt_logprobs is not None
        again = eng.generate(PROMPT, scored(k=2, n=5))
        assert as_tuples(prompt_logprobs(again)) == as_tuples(prompt_logprobs(first))
        # a plain request still reuses the blocks the scored ones cached
        assert token_ids(eng.generate(PROMPT, greedy(5))) == plain
        assert eng.kv.prefix_hits > hits
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_batch_invariance_alongside_others(tiny):
    eng = start_engine(tiny, max_scored_rows=16)
    try:
        alone = as_tuples(prompt_logprobs(eng.generate(PROMPT, scored(k=4, n=3))))
        others = [eng.add_request(list(range(60 + i, 80 + 2 * i)), greedy(8)) for i in range(6)]
        mine = eng.add_request(PROMPT, scored(k=4, n=3))
        more = eng.add_request(PROMPT[::-1], scored(k=1))
        assert as_tuples(prompt_logprobs(list(mine))) == alone
        assert len(prompt_logprobs(list(more))) == len(PROMPT)
        assert all(len(token_ids(list(s))) == 8 for s in others)
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_preempted_scoring_request_gives_the_same_scores(tiny):
    big = start_engine(tiny, max_scored_rows=16)
    small = start_engine(tiny, num_blocks=20, max_batch_tokens=16, max_scored_rows=8)  # 80 slots
    try:
        prompts = [PROMPT, PROMPT[3:], PROMPT[::-1]]
        ref = [as_tuples(prompt_logprobs(big.generate(p, scored(k=2, n=6)))) for p in prompts]
        streams = [small.add_request(p, scored(k=2, n=6)) for p in prompts]
        assert [as_tuples(prompt_logprobs(list(s))) for s in streams] == ref
        assert small.stats().preemptions > 0
        assert_all_blocks_free(small)
    finally:
        big.stop()
        small.stop()


def test_max_tokens_zero_without_scores_is_prefill_only(tiny):
    eng = start_engine(tiny)
    try:
        deltas = eng.generate(PROMPT[:9], SamplingParams(temperature=0.0, max_tokens=0))
        assert [(d.token_id, d.finish_reason, d.prompt_logprobs) for d in deltas] == [(None, "length", None)]
        assert deltas[0].num_prompt_tokens == 9
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_one_token_prompt_has_only_the_null_entry(tiny):
    eng = start_engine(tiny)
    try:
        assert prompt_logprobs(eng.generate([7], scored(k=2, n=1))) == [None]
    finally:
        eng.stop()


def test_scored_rows_per_step_bound():
    assert max_scored_rows(262_144, 512) == 128  # Gemma 3: 128 MiB of logits rows a step
    assert max_scored_rows(32_000, 512) == 512
    assert max_scored_rows(10**9, 512) == 16  # never fewer than 16 rows
    assert max_scored_rows(300, 8) == 8


def test_non_finite_scored_row_fails_that_request_only(tiny):
    from tests.engine.test_nonfinite_guard import PoisonedModel

    model, tok = tiny
    eng = start_engine((PoisonedModel(model, 20, np.nan), tok), max_scored_rows=16)
    try:
        bad = eng.add_request(PROMPT, scored(k=1, n=3))
        ok = eng.add_request(PROMPT[:12], greedy(4))  # never reaches position 20
        (d,) = list(bad)
        assert d.finish_reason == "error" and "at position 20" in d.error and d.prompt_logprobs is None
        assert len(token_ids(list(ok))) == 4
        assert eng.stats().nonfinite_rows == 1
        assert_all_blocks_free(eng)
    finally:
        eng.stop()
