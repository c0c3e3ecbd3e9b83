"""Attention over a prefill's f16 / q8_0 blocks widened once (kv_widen.py): bit for bit what
attention computes over a float32 cache holding kv_row's values, and what it computes widening
each row as it reads it, for every layout: prefills with and without a cached prefix, sliding
windows, soft-capping, sequences sharing blocks, mixed prefill and decode.

The second comparison runs two compiled variants of the attention kernel (f16 / q8_0 and
float32 caches). A variant compiled in this process and one loaded from the on-disk cache were
seen to differ in the last bit for a few tokens (docs/kernels.md, "A prefill's f16 / q8_0 blocks
widened once"), so that comparison allows 2 ulp; the first is exact.
"""

import numpy as np
import pytest

from edged.backends import cpu
from edged.backends.base import Batch
from edged.backends.cpu import attention, kv_codec, kv_widen
from tests.backends.test_attention import make_case


def _as_f32(kv):
    """A float32 cache holding what kv_row reads from kv (f16 / q8_0)."""
    n_blocks, bs, kvh, hd = kv.k.shape
    out = cpu.allocate_kv(n_blocks, bs, kvh, hd, "f32")
    for src, scale, dst in ((kv.k, kv.k_scale, out.k), (kv.v, kv.v_scale, out.v)):
        dst[:] = src.astype(np.float32)
        if scale is not None:
            dst *= np.repeat(scale.astype(np.float32), 32, axis=-1)
    return out


def _ulps(a, b):
    """Largest distance in float32 units in the last place between a and b."""
    ia, ib = (x.view(np.int32).astype(np.int64) for x in (a, b))
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max())

LAYOUTS = {
    "prefill": [(0, 300)],
    "prefill after a prefix": [(40, 70)],
    "mixed": [(11, 60), (0, 1), (5, 1), (39, 1)],
    "two prefills": [(0, 33), (17, 90)],
}


def _both(monkeypatch, q, kv, batch, scale, window=0, softcap=0.0):
    """(widened, as read, whether the widened call used the copy)."""
    taken = []
    real = kv_widen.widened

    def spy(*a):
        got = real(*a)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(kv_widen, "widened", spy)
    monkeypatch.setattr(kv_widen, "MIN_REUSE", 0)
    wide = attention(q, kv, batch, scale, window=window, softcap=softcap)
    used = taken[-1]
    monkeypatch.setattr(kv_widen, "MIN_REUSE", 10**9)
    read = attention(q, kv, batch, scale, window=window, softcap=softcap)
    assert taken[-1] is False
    return wide, read, used


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (24, 0.0), (0, 5.0)])
def test_widened_blocks_give_the_float32_paths_bits(monkeypatch, kv_type, layout, window, softcap):
    rng = np.random.default_rng(len(layout) * 7 + window)
    q, kv, batch, *_ = make_case(rng, 16, 2, 2, 64, LAYOUTS[layout], kv_type)
    q *= 3  # logits spread enough that the cap and the softmax do something
    wide, read, used = _both(monkeypatch, q, kv, batch, 0.125, window, softcap)
    assert used
    f32 = attention(q, _as_f32(kv), batch, 0.125, window=window, softcap=softcap)
    assert np.array_equal(wide.view(np.int32), f32.view(np.int32))
    assert _ulps(wide, read) <= 2


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_shared_blocks_are_widened_once(monkeypatch, kv_type):
    """Two sequences on the same blocks (a prefix-cache hit) attend as they do apart."""
    rng = np.random.default_rng(3)
    q, kv, batch, *_ = make_case(rng, 16, 1, 4, 64, [(0, 48)], kv_type)
    tables = np.vstack([batch.block_tables, batch.block_tables])
    twice = Batch(token_ids=np.zeros(96, np.int32), positions=np.tile(batch.positions, 2),
                  seq_starts=np.array([0, 48, 96], np.int32), seq_lens=np.array([48, 48], np.int32),
                  block_tables=tables, slot_mapping=np.full(96, -1, np.int32),
                  logits_indices=np.array([47, 95], np.int32), block_size=16)
    k, v, ks, vs = kv_codec.kernel_arrays(kv)
    wide = kv_widen.widened(k, v, ks, vs, tables, twice.seq_starts, twice.positions, 0)
    assert wide is not None and wide[0].shape[0] == 3  # 48 keys: 3 blocks, not 6
    got, read, used = _both(monkeypatch, np.vstack([q, q]), kv, twice, 0.125)
    assert used and _ulps(got, read) <= 2
    assert np.array_equal(got.view(np.int32), attention(np.vstack([q, q]), _as_f32(kv), twice, 0.125).view(np.int32))
    assert np.array_equal(got[:48], got[48:])


def test_decode_batches_read_the_cache_itself():
    """One token per sequence visits each row once: nothing is widened ahead."""
    rng = np.random.default_rng(5)
    q, kv, batch, *_ = make_case(rng, 16, 1, 4, 64, [(100, 1), (37, 1), (5, 1)], "f16")
    args = (*kv_codec.kernel_arrays(kv), batch.block_tables, batch.seq_starts, batch.positions, 0)
    assert kv_widen.widened(*args) is None
    rng = np.random.default_rng(5)
    q, kv, batch, *_ = make_case(rng, 16, 1, 4, 64, [(0, 100)], "f16")
    args = (*kv_codec.kernel_arrays(kv), batch.block_tables, batch.seq_starts, batch.positions, 0)
    assert kv_widen.widened(*args) is not None


def test_copies_over_the_caps_are_not_made(monkeypatch):
    """One sequence's copy is capped (a token scans its own sequence's rows), and so is the
    batch's: two 100-token sequences of 7 blocks each."""
    rng = np.random.default_rng(6)
    q, kv, batch, *_ = make_case(rng, 16, 1, 4, 64, [(0, 100), (0, 100)], "q8_0")
    args = (*kv_codec.kernel_arrays(kv), batch.block_tables, batch.seq_starts, batch.positions, 0)
    seq = 7 * 16 * 64 * 4 * 2  # 7 blocks of K and V in float32
    monkeypatch.setattr(kv_widen, "MAX_BYTES", seq - 1)
    assert kv_widen.widened(*args) is None
    monkeypatch.setattr(kv_widen, "MAX_BYTES", seq)
    assert kv_widen.widened(*args) is not None
    monkeypatch.setattr(kv_widen, "MAX_TOTAL_BYTES", 2 * seq - 1)
    assert kv_widen.widened(*args) is None
    monkeypatch.setattr(kv_widen, "MAX_TOTAL_BYTES", 2 * seq)
    assert kv_widen.widened(*args) is not None


def test_a_bad_table_entry_is_still_an_error():
    rng = np.random.default_rng(8)
    q, kv, batch, *_ = make_case(rng, 16, 1, 4, 64, [(0, 100)], "f16")
    batch.block_tables[0, 2] = kv.k.shape[0] + 3  # a block a position needs, past the cache
    with pytest.raises(ValueError, match="block table entry"):
        attention(q, kv, batch, 0.125)
    batch.block_tables[0, 2] = -1
    with pytest.raises(ValueError, match="block table entry"):
        attention(q, kv, batch, 0.125)
