"""A token's matmul output must not depend on the batch it is in: gemv (small n) and gemm (large n)
give bit-identical rows, so greedy decoding alone equals decoding inside any batch."""

import numpy as np
import pytest

from edged.backends.base import KV_TYPES
from edged.backends.cpu.matmul import gemv_max_n, matmul, supported_types
from tests.helpers.qdata import random_qtensor


@pytest.mark.parametrize("qtype", supported_types(), ids=lambda t: t.name)  # every type with a kernel
def test_rows_identical_alone_and_in_a_batch(qtype):
    k = 512
    w = random_qtensor(qtype, 37, k, seed=3)
    x = np.random.default_rng(4).standard_normal((gemv_max_n(qtype) + 19, k)).astype(np.float32)
    batched = matmul(w, x)  # gemm path
    for t in (0, 7, x.shape[0] - 1):
        alone = matmul(w, x[t : t + 1])  # gemv path
        np.testing.assert_array_equal(alone[0], batched[t])


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_attention_token_identical_alone_and_in_a_batch(kv_type):
    from edged.backends.base import Batch
    from edged.backends.cpu import allocate_kv, attention, store_kv

    rng = np.random.default_rng(0)
    bs, hd, kvh, h = 16, 64, 1, 4
    kv = allocate_kv(128, bs, kvh, hd, kv_type)
    rows = (128 * bs, kvh, hd)
    store_kv(kv, rng.standard_normal(rows).astype(np.float32), rng.standard_normal(rows).astype(np.float32),
             np.arange(128 * bs, dtype=np.int32))
    tables = rng.permutation(128).astype(np.int32).reshape(2, 64)  # two sequences' blocks

    def run(positions_per_seq, seqs):
        pos = np.concatenate(positions_per_seq).astype(np.int32)
        starts = np.cumsum([0] + [len(p) for p in positions_per_seq]).astype(np.int32)
        b = Batch(token_ids=np.zeros(len(pos), np.int32), positions=pos, seq_starts=starts,
                  seq_lens=np.array([p[-1] + 1 for p in positions_per_seq], np.int32),
                  block_tables=tables[seqs], slot_mapping=np.zeros(len(pos), np.int32),
                  logits_indices=np.zeros(0, np.int32), block_size=bs)
        q = np.random.default_rng(len(pos)).standard_normal((len(pos), h, hd)).astype(np.float32)
        q[0] = qa  # the token under test is always first
        return attention(q, kv, b, 0.125)[0]

    qa = rng.standard_normal((h, hd)).astype(np.float32)
    for p in (40, 300, 700):  # one chunk, two chunks, several
        alone = run([np.array([p])], [0])
        with_prefill = run([np.array([p]), np.arange(0, 900)], [0, 1])
        np.testing.assert_array_equal(alone, with_prefill)
