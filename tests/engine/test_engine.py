"""Engine end to end on tiny random models: batch invariance, preemption, prefix cache, abort."""

import pytest

from tests.engine.engine_helpers import (assert_all_blocks_free, assert_preempted_equal,
                                         assert_prefix_hit_repeats, greedy, load_tiny, random_prompts,
                                         start_engine, token_ids)


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def tiny(request, tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("m"), request.param)


def test_batch_invariance_16_mixed_requests(tiny):
    prompts = random_prompts(tiny[0].vocab_size)
    eng = start_engine(tiny)
    try:
        alone = [token_ids(eng.generate(p, greedy())) for p in prompts]
        streams = [eng.add_request(p, greedy()) for p in prompts]
        together = [token_ids(list(s)) for s in streams]
        assert together == alone
        assert eng.stats().steps > 0
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_preemption_gives_identical_greedy_outputs(tiny):
    prompts = random_prompts(tiny[0].vocab_size, n=6, seed=1)
    big = start_engine(tiny)
    small = start_engine(tiny, num_blocks=24, max_batch_tokens=16)  # 96 token slots for 6 x (<=40+12)
    try:
        assert_preempted_equal(big, small, prompts, lambda e, p: e.add_request(p, greedy(12)))
    finally:
        big.stop()
        small.stop()


def test_prefix_hit_same_output(tiny):
    eng = start_engine(tiny)
    try:
        prefix = list(range(5, 37))  # 8 full blocks of 4
        assert_prefix_hit_repeats(eng, prefix + [40, 41], greedy(), 32)
    finally:
        eng.stop()


def test_abort_queued_and_running_frees_everything(tiny):
    eng = start_engine(tiny, max_seqs=1)
    try:
        running = eng.add_request(list(range(5, 30)), greedy(10_000 // 100))
        queued = eng.add_request(list(range(5, 9)), greedy(5))
        eng.abort(queued.request_id)
        eng.abort(running.request_id)
        assert list(queued)[-1].finish_reason == "abort"
        assert list(running)[-1].finish_reason in ("abort", "length")
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_bad_requests_rejected_before_queueing(tiny):
    eng = start_engine(tiny, num_blocks=8)
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            eng.add_request([tiny[0].vocab_size], greedy())
        with pytest.raises(ValueError, match="exceeds"):
            eng.add_request(list(range(5, 35)), greedy(10))
        assert len(token_ids(eng.generate([5, 6], greedy(3)))) == 3  # still serving
    finally:
        eng.stop()
