"""CUDA paged attention (simulator) against the CPU backend: prefill, decode, mixed batches, GQA,
sliding window, softcap, shuffled block tables."""

import numpy as np
import pytest

from edged.backends.base import Batch
from edged.backends.cpu.attention import allocate_kv as cpu_allocate_kv, store_kv as cpu_store_kv
from tests.backends.cuda.checks import check_attention, ops

MIXED = [(11, 9), (0, 1), (5, 1), (39, 1)]  # one prefill chunk after context, three decodes


@pytest.mark.parametrize("kvh,g", [(2, 1), (1, 4), (2, 2)])
def test_mixed_batch(kvh, g):
    check_attention(bs=4, kvh=kvh, g=g, hd=16, seqs=MIXED)


@pytest.mark.parametrize("window", [3, 8])
def test_sliding_window(window):
    check_attention(bs=4, kvh=1, g=2, hd=16, seqs=MIXED, window=window, seed=1)


def test_softcap():
    check_attention(bs=8, kvh=1, g=2, hd=16, seqs=[(0, 6), (20, 1)], softcap=2.0, seed=2)


def test_sinks():
    """Sinks below and above the logits; the 70-key decode takes the chunked path (combine)."""
    check_attention(bs=4, kvh=1, g=2, hd=16, seqs=[(0, 3), (69, 1)], seed=5,
                    sinks=np.array([-1.0, 4.0], np.float32))


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_kv_types(kv_type):
    """f16 / q8_0 caches: the same stored bits as the CPU's, attention reading them alike."""
    check_attention(bs=4, kvh=1, g=2, hd=32, seqs=[(0, 3), (9, 1)], seed=6, kv_type=kv_type)


def test_prefill_alone_and_decode_alone():
    check_attention(bs=4, kvh=1, g=1, hd=16, seqs=[(0, 7)], seed=3)
    check_attention(bs=4, kvh=1, g=1, hd=16, seqs=[(70, 1)], seed=4)  # 71 keys: three key tiles


def test_store_kv_skips_negative_slots():
    o = ops()
    kv = o.allocate_kv(2, 2, 1, 4)
    k = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    o.store_kv(kv, o.upload(k), o.upload(-k), np.array([3, -1], np.int32))
    kk, vv = o.to_host(kv.k), o.to_host(kv.v)
    np.testing.assert_array_equal(kk[1, 1, 0], k[0, 0])
    np.testing.assert_array_equal(vv[1, 1, 0], -k[0, 0])
    assert np.count_nonzero(kk) == 3  # k[0] holds one zero; nothing else written
    with pytest.raises(ValueError, match="slot out of range"):
        o.store_kv(kv, o.upload(k), o.upload(k), np.array([4, 0], np.int32))


def _batch(positions, starts, tables):
    n = len(positions)
    return Batch(token_ids=np.zeros(n, np.int32), positions=np.array(positions, np.int32),
                 seq_starts=np.array(starts, np.int32), seq_lens=np.array([1], np.int32),
                 block_tables=np.array(tables, np.int32), slot_mapping=np.zeros(n, np.int32),
                 logits_indices=np.zeros(1, np.int32), block_size=2)


def test_bad_batches_are_clear_errors():
    o = ops()
    with pytest.raises(ValueError, match="partition"):
        o.prepare_batch(_batch([0, 1], [0, 1], [[0]]))
    with pytest.raises(ValueError, match="negative position"):
        o.prepare_batch(_batch([-1], [0, 1], [[0]]))
    with pytest.raises(ValueError, match="block table"):
        o.prepare_batch(_batch([2], [0, 1], [[0, -1]]))
    kv = o.allocate_kv(2, 2, 1, 4)
    with pytest.raises(ValueError, match="multiple"):
        o.attention(o.upload(np.zeros((1, 1, 8), np.float32)), kv, _batch([0], [0, 1], [[0]]), 1.0)


def test_prepare_batch_uploads_every_array():
    o = ops()
    b = o.prepare_batch(_batch([0, 1], [0, 2], [[0]]))
    assert b.block_size == 2
    for name in ("token_ids", "positions", "seq_starts", "seq_lens", "block_tables", "slot_mapping", "logits_indices"):
        arr = getattr(b, name)
        assert not isinstance(arr, np.ndarray) and hasattr(arr, "copy_to_host"), name


@pytest.mark.parametrize("window", [0, 100])
def test_long_context_split_into_chunks(window):
    from edged.backends.cuda.attention import CHUNK

    assert 130 > 2 * CHUNK  # three chunks of keys for the longest token (two with the window)
    check_attention(bs=8, kvh=1, g=2, hd=16, seqs=[(130, 3), (0, 2)], window=window, seed=5)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_store_kv_saturates_as_the_cpu(kv_type):
    """Values past float16's range are held as the CPU's store holds them (+-65504; q8_0: the scale
    at 65504, the values at +-127), bit for bit, not as inf; an f16 NaN stays NaN."""
    kvh, hd = 1, 32
    k = np.ones((3, kvh, hd), np.float32)
    k[0, 0, :3] = [1e6, -3e38, 70000.0]
    k[1, 0, :] = 2e7  # a whole q8_0 block past 65504 * 127
    k[2, 0, 0] = np.nan if kv_type == "f16" else 1.0
    slots = np.arange(3, dtype=np.int32)
    cpu_kv = cpu_allocate_kv(1, 4, kvh, hd, kv_type)
    cpu_store_kv(cpu_kv, k, -k, slots)
    o = ops()
    kv = o.allocate_kv(1, 4, kvh, hd, kv_type)
    o.store_kv(kv, o.upload(k), o.upload(-k), o.upload(slots))
    for got, want in ((kv.k, cpu_kv.k), (kv.v, cpu_kv.v), (kv.k_scale, cpu_kv.k_scale)):
        if want is not None:
            np.testing.assert_array_equal(o.to_host(got), want)  # NaN where the CPU holds NaN
    assert np.isfinite(o.to_host(kv.k)[0, :2].astype(np.float32)).all()
