"""Block accounting with exact block ids, prefix hits and LRU eviction order."""

import pytest

from edged.kv.block_pool import BlockPool, KVExhausted, hash_block
from edged.kv.manager import KVCacheManager


def _check_all_accounted(pool: BlockPool):
    in_use = sum(1 for rc in pool.ref_counts if rc > 0)
    assert in_use + pool.num_free == pool.num_blocks


def test_allocate_in_order_and_free_returns_blocks():
    pool = BlockPool(4, 2)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(KVExhausted):
        pool.allocate()
    pool.free([3, 1])
    assert pool.num_free == 2
    assert pool.allocate() == 3  # least recently freed first
    assert pool.allocate() == 1
    with pytest.raises(ValueError, match="double free"):
        pool.free([0, 0])


def test_hash_chain_depends_on_parent_and_tokens():
    a = hash_block(None, [1, 2])
    assert a == hash_block(None, [1, 2])
    assert a != hash_block(None, [1, 3])
    assert hash_block(a, [3, 4]) != hash_block(None, [3, 4])
    assert len(a) == 32  # SHA-256


def test_prefix_hit_exact_block_ids_and_refcounts():
    pool = BlockPool(10, 4)
    kv = KVCacheManager(pool)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    assert kv.claim_cached_prefix("a", prompt) == 0
    assert kv.allocate("a", 10)
    assert kv.table("a") == [0, 1, 2]
    kv.cache_full_blocks("a", prompt, 10)
    # same 8-token prefix, different tail: blocks 0 and 1 are shared
    prompt_b = list(range(8)) + [99, 98, 97]
    assert kv.claim_cached_prefix("b", prompt_b) == 8
    assert kv.table("b") == [0, 1]
    assert pool.ref_counts[:3] == [2, 2, 1]
    assert kv.allocate("b", 11)
    assert kv.table("b") == [0, 1, 3]
    kv.free("a")
    assert pool.ref_counts[:4] == [1, 1, 0, 1]
    kv.free("b")
    assert pool.num_free == 10
    _check_all_accounted(pool)
    assert kv.prefix_hit_rate == pytest.approx(8 / 21)


def test_full_prompt_cached_still_leaves_one_token_to_compute():
    pool = BlockPool(8, 4)
    kv = KVCacheManager(pool)
    prompt = list(range(8))
    kv.claim_cached_prefix("a", prompt)
    kv.allocate("a", 8)
    kv.cache_full_blocks("a", prompt, 8)
    kv.free("a")
    # all 8 tokens cached, but the last block is recomputed so the prompt's last token gives logits
    assert kv.claim_cached_prefix("b", prompt) == 4
    assert kv.table("b") == [0]


def test_freed_cached_blocks_are_evicted_lru_tail_first():
    pool = BlockPool(4, 2)
    kv = KVCacheManager(pool)
    p = [1, 2, 3, 4, 5, 6, 7]  # 3 full blocks + 1
    kv.claim_cached_prefix("a", p)
    kv.allocate("a", 7)
    kv.cache_full_blocks("a", p, 7)
    assert kv.table("a") == [0, 1, 2, 3]
    kv.free("a")  # freed tail first: 3, 2, 1, 0
    assert pool.num_cached_free == 3
    # a new unrelated request takes blocks in LRU order: 3 (uncached), then 2 (evicts 3rd block)
    kv.claim_cached_prefix("x", [50, 51, 52])
    assert kv.allocate("x", 3)
    assert kv.table("x") == [3, 2]
    assert pool.lookup(hash_block(hash_block(hash_block(None, [1, 2]), [3, 4]), [5, 6])) is None
    # the first two blocks of `a` still hit
    assert kv.claim_cached_prefix("c", p) == 4
    assert kv.table("c") == [0, 1]
    kv.free("x")
    kv.free("c")
    _check_all_accounted(pool)
    assert pool.num_free == 4


def test_disabled_prefix_cache_never_hits():
    pool = BlockPool(8, 2, enable_prefix_cache=False)
    kv = KVCacheManager(pool)
    p = [1, 2, 3, 4, 5]
    kv.claim_cached_prefix("a", p)
    kv.allocate("a", 5)
    kv.cache_full_blocks("a", p, 5)
    kv.free("a")
    assert kv.claim_cached_prefix("b", p) == 0
    assert pool.num_cached_free == 0


def test_allocate_fails_without_taking_anything():
    pool = BlockPool(3, 2)
    kv = KVCacheManager(pool)
    assert kv.allocate("a", 4)
    assert not kv.allocate("b", 4)
    assert kv.table("b") == []
    assert pool.num_free == 1
