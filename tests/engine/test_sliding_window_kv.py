"""Sliding-window KV group: blocks before the window are freed step by step (exact block ids),
prefix hits need only the window's blocks, and greedy outputs match a single-pool engine."""

import numpy as np
import pytest

from edged.engine.request import Request
from edged.engine.scheduler import Scheduler
from edged.engine.sizing import kv_layout, plan_kv, window_blocks_needed
from edged.kv.block_pool import BlockPool
from edged.kv.manager import KVCacheManager
from tests.engine.engine_helpers import (assert_all_blocks_free, assert_preempted_equal,
                                         assert_prefix_hit_repeats, greedy, load_tiny, random_prompts,
                                         start_engine, token_ids)

W, BS = 8, 4  # window and block size of the block-accounting tests


def _manager(full_blocks=16, window_blocks=8):
    full, window = BlockPool(full_blocks, BS), BlockPool(window_blocks, BS)
    return KVCacheManager(full, W, window), full, window


def _assert_all_free(*pools):
    for p in pools:
        assert p.num_free == p.num_blocks and not any(p.ref_counts)


def test_window_blocks_freed_step_by_step_exact_ids():
    kv, full, window = _manager()
    s = Scheduler(kv, max_batch_tokens=4, max_seqs=1)
    req = Request("a", list(range(100, 114)), max_tokens=6)  # 14 prompt tokens
    s.add(req)
    seen = []  # (computed tokens, full table, window table) after each step
    while req.num_output_tokens < req.max_tokens:
        step = s.schedule()
        s.update(step)
        if req.num_computed_tokens == req.num_tokens:
            req.token_ids.append(7)
        seen.append((req.num_computed_tokens, list(kv.table("a")), list(kv.window_table("a"))))
    # block i is released once (i+1)*4 <= computed - 8 + 1, oldest first; full blocks stay
    assert seen == [
        (4, [0], [0]),
        (8, [0, 1], [0, 1]),
        (12, [0, 1, 2], [-1, 1, 2]),
        (14, [0, 1, 2, 3], [-1, 1, 2, 3]),  # block 3: the freed 0 went to the back of the queue
        (15, [0, 1, 2, 3], [-1, -1, 2, 3]),
        (16, [0, 1, 2, 3], [-1, -1, 2, 3]),
        (17, [0, 1, 2, 3, 4], [-1, -1, 2, 3, 4]),
        (18, [0, 1, 2, 3, 4], [-1, -1, 2, 3, 4]),
        (19, [0, 1, 2, 3, 4], [-1, -1, -1, 3, 4]),
    ]
    assert window.num_used == 2 and full.num_used == 5
    s.finish(req, "length")
    _assert_all_free(full, window)
    # freed blocks kept their prefix hashes: blocks 0-3 hold the 4 full blocks in both pools
    assert full.num_cached_free == 4 and window.num_cached_free == 4


@pytest.mark.parametrize("budget,max_seqs", [(16, 4), (7, 3), (64, 8)])
def test_window_pool_sized_by_window_blocks_needed_never_runs_short(budget, max_seqs):
    # many requests of random lengths with chunked prefill: the full pool is ample, so any
    # preemption would mean the sliding-window pool ran short
    rng = np.random.default_rng(budget)
    need = window_blocks_needed(W, BS, budget, max_seqs)
    kv, full, window = _manager(full_blocks=1000, window_blocks=need)
    s = Scheduler(kv, max_batch_tokens=budget, max_seqs=max_seqs)
    reqs = [Request(str(i), rng.integers(0, 50, size=int(rng.integers(1, 60))).tolist(),
                    max_tokens=int(rng.integers(1, 30))) for i in range(40)]
    for r in reqs:
        s.add(r)
    peak = 0
    while s.has_work:
        step = s.schedule()
        peak = max(peak, window.num_used)
        s.update(step)
        for r, _ in step.items:
            if r.num_computed_tokens == r.num_tokens:
                r.token_ids.append(7)
                if r.num_output_tokens == r.max_tokens:
                    s.finish(r, "length")
    assert s.num_preemptions == 0 and peak <= need
    _assert_all_free(full, window)


def _run_prompt(kv, rid, prompt):
    """Compute a whole prompt in one step as the scheduler would, then finish the request."""
    assert kv.claim_cached_prefix(rid, prompt) == 0
    assert kv.allocate(rid, len(prompt))
    kv.cache_full_blocks(rid, prompt, len(prompt))
    kv.free_outside_window(rid, len(prompt))
    kv.free(rid)


P = list(range(200, 225))  # 25 tokens: 6 full blocks + 1


def test_prefix_hit_needs_only_the_window_blocks():
    kv, full, window = _manager()
    _run_prompt(kv, "a", P)
    # window pool free queue: 7, then 0-3 (freed by the window), then 6, 5, 4 (freed tail first)
    assert kv.allocate("x", 20)  # 5 window blocks: 7, 0, 1, 2, 3 -> the early blocks' hashes go
    assert kv.window_table("x") == [7, 0, 1, 2, 3]
    assert kv.claim_cached_prefix("b", P + [99]) == 24  # the window of a 24-token hit: blocks 4, 5
    assert kv.table("b") == [0, 1, 2, 3, 4, 5]
    assert kv.window_table("b") == [-1, -1, -1, -1, 4, 5]
    assert kv.allocate("b", 26)
    kv.free("b")
    kv.free("x")
    _assert_all_free(full, window)


def test_prefix_hit_shortened_when_window_blocks_were_evicted():
    kv, full, window = _manager()
    _run_prompt(kv, "a", P)
    assert kv.claim_cached_prefix("r", P[:8] + [1000]) == 8  # holds window blocks 0 and 1
    assert kv.window_table("r") == [0, 1]
    assert kv.allocate("x", 20)  # evicts the window pool's 7, 2, 3, 6, 5: only 4 stays cached
    assert kv.window_table("x") == [7, 2, 3, 6, 5]
    # the full pool has 24 tokens, but no window ending at 24, 20, 16 or 12 is complete: the
    # longest one is blocks 0-1 (an 8-token hit)
    assert kv.claim_cached_prefix("b", P + [99]) == 8
    assert kv.table("b") == [0, 1] and kv.window_table("b") == [0, 1]
    assert window.ref_counts[0] == 2 and full.ref_counts[2] == 0
    for rid in ("b", "x", "r"):
        kv.free(rid)
    _assert_all_free(full, window)


def test_allocation_fails_when_either_group_is_short():
    kv, full, window = _manager(full_blocks=16, window_blocks=3)
    assert not kv.allocate("a", 16)  # 4 blocks: the window pool has 3
    assert kv.table("a") == [] and kv.window_table("a") == [] and full.num_free == 16
    assert kv.allocate("a", 12)
    kv.free("a")
    _assert_all_free(full, window)


# -- engine on a tiny Gemma 3 (5 sliding layers of window 8, 1 global) ---------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("swa"), "gemma3", sliding_window=W)


def _engine(tiny, **cfg):
    return start_engine(tiny, **{"block_size": BS, "max_batch_tokens": 16, **cfg})


def _ids(deltas):
    return token_ids(deltas, finish="length")


def test_tiny_model_has_two_groups(tiny):
    model, _ = tiny
    lay = kv_layout(model)
    assert (lay.window, lay.bytes_per_token * 6, lay.window_bytes_per_token * 6) == (
        W, model.kv_bytes_per_token(), model.kv_bytes_per_token() * 5)
    assert not kv_layout(model, free_window_blocks=False).two_groups
    plan = plan_kv(model, BS, ctx=64, max_seqs=2, max_batch_tokens=16)
    # two requests: (2 x 6 + 16) // 4 + 2 x 2 = 11 window blocks (one alone: 7)
    assert (plan.num_blocks, plan.window_num_blocks) == (32, 11) and window_blocks_needed(W, BS, 16) == 7
    kv = model.allocate_kv(32, BS, window_num_blocks=plan.window_num_blocks)
    assert [c.k.shape[0] for c in kv] == [plan.window_num_blocks] * 5 + [32]


def test_plan_kv_splits_a_budget_and_never_outgrows_one_pool(tiny):
    model, _ = tiny  # K+V bytes per token: 512 per layer, 1 global + 5 sliding layers
    budget = 100 * BS * 3072  # 100 blocks of every layer
    plan = plan_kv(model, BS, kv_memory=str(budget), max_seqs=4, max_batch_tokens=16)
    # window pool: (4 x 6 + 16) // 4 + 2 x 4 = 18 blocks; the global layer gets the rest
    assert (plan.num_blocks, plan.window_num_blocks) == ((budget - 18 * BS * 2560) // (BS * 512), 18)
    assert plan.nbytes <= budget
    # a context shorter than a window: the window pool is capped at the full pool's size, so two
    # pools cost what one would
    one = plan_kv(model, BS, ctx=8, max_seqs=4, max_batch_tokens=16, free_window_blocks=False)
    two = plan_kv(model, BS, ctx=8, max_seqs=4, max_batch_tokens=16)
    assert (two.num_blocks, two.window_num_blocks, two.nbytes) == (8, 8, one.nbytes)


def test_greedy_same_with_and_without_freeing(tiny):
    prompts = random_prompts(tiny[0].vocab_size, 4, seed=3)
    on = _engine(tiny, max_seqs=4)
    off = _engine(tiny, max_seqs=4, free_window_blocks=False)
    try:
        assert on.window_pool is not None and off.window_pool is None
        # 40 generated tokens: far past the 8-token window
        ref = [_ids(off.generate(p, greedy(40))) for p in prompts]
        got = [_ids(on.generate(p, greedy(40))) for p in prompts]
        assert got == ref
        assert_all_blocks_free(on)
        assert_all_blocks_free(off)
    finally:
        on.stop()
        off.stop()


def test_window_pool_of_one_request_serves_a_long_generation(tiny):
    # without freeing, 80 tokens would need 20 blocks; the window pool has (8 - 2 + 16) // 4 + 2 = 7
    per_request = window_blocks_needed(W, BS, 16)
    eng = _engine(tiny, max_seqs=1, window_num_blocks=per_request)
    try:
        out = _ids(eng.generate(list(range(5, 35)), greedy(50)))
        assert len(out) == 50 and eng.stats().preemptions == 0
        assert_all_blocks_free(eng)
    finally:
        eng.stop()
    with pytest.raises(ValueError, match="cannot hold one request"):
        _engine(tiny, max_seqs=1, window_num_blocks=per_request - 1)


def test_preemption_with_freeing_gives_identical_outputs(tiny):
    prompts = random_prompts(tiny[0].vocab_size, 6, seed=1)
    big = _engine(tiny, free_window_blocks=False)
    small = _engine(tiny, num_blocks=24)  # 96 full-attention slots for 6 x (<= 40 + 20)
    try:
        assert_preempted_equal(big, small, prompts, lambda e, p: e.add_request(p, greedy(20)), ids=_ids)
    finally:
        big.stop()
        small.stop()


def test_sixteen_mixed_requests_batched_equal_alone_with_freeing(tiny):
    prompts = random_prompts(tiny[0].vocab_size, 16, seed=0)
    eng = _engine(tiny)
    try:
        alone = [_ids(eng.generate(p, greedy(12))) for p in prompts]
        together = [_ids(list(s)) for s in [eng.add_request(p, greedy(12)) for p in prompts]]
        assert together == alone
        # 256 full-attention blocks hold all 16; the window pool (60 blocks) is sized never to run short
        assert eng.stats().preemptions == 0 and eng.stats().window_blocks_total == 60
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_prefix_hit_with_freed_window_blocks_same_output(tiny):
    eng = _engine(tiny)
    try:
        prompt = list(range(5, 42))  # 37 tokens: 9 full blocks, most out of the window when done
        assert_prefix_hit_repeats(eng, prompt, greedy(6), 36, ids=_ids)
    finally:
        eng.stop()


def test_stats_and_metrics_report_both_pools(tiny):
    from types import SimpleNamespace

    from edged.server.metrics import ServerMetrics

    eng = _engine(tiny, max_seqs=2)
    try:
        eng.generate(list(range(5, 30)), greedy(4))
        st = eng.stats()
        assert (st.blocks_total, st.window_blocks_total) == (256, window_blocks_needed(W, BS, 16, 2))
        assert st.window_blocks_cached_free == st.blocks_cached_free == 7  # 28 computed tokens
        text = ServerMetrics(lambda: [SimpleNamespace(model_name="m", engine=eng)]).render().decode()
        assert f'edged_kv_window_blocks_total{{model="m"}} {float(st.window_blocks_total)}' in text
        assert 'edged_kv_window_blocks_used{model="m"} 0.0' in text
        assert 'edged_kv_bytes_used{model="m"} 0.0' in text
    finally:
        eng.stop()
