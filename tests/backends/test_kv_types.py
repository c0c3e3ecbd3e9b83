"""KV cache types f32 / f16 / q8_0 on the CPU backend: what store_kv writes, what attention reads.

Round trip: f16 rows are numpy's float16 cast (round to nearest even) bit for bit; q8_0 rows are
gguf-py's Q8_0 blocks (its quantize, the reference of llama.cpp's quantize_row_q8_0) bit for bit.
Attention: within 1e-5 of float64 attention over the values the cache holds (as for f32), and
within a bound derived from the data of float64 attention over the float32 rows: with logits
moved by at most eps = max_j |scale q . dK_j| and values by at most max|dV|, a softmax average
moves by at most max|dV| + (e^(2 eps) - 1) max|V'|.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from edged.backends.base import KV_TYPES, check_kv_type, kv_row_bytes
from edged.backends.cpu import allocate_kv, attention, store_kv
from tests.backends.test_attention import MIXED, make_case, ref_attention
from tests.helpers import numpy_ops


def _stored(kv, n):
    """(K, V) float64 [n, kvh, hd] of slots 0..n-1 as the cache holds them."""
    slots = np.arange(n)
    return numpy_ops.kv_values(kv, slots // kv.block_size, slots % kv.block_size)


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_store_round_trip(kv_type):
    rng = np.random.default_rng(1)
    n, kvh, hd = 21, 2, 64
    k = rng.standard_normal((n, kvh, hd)).astype(np.float32) * 3
    v = rng.standard_normal((n, kvh, hd)).astype(np.float32)
    k[0, 0, :32] = 0.0  # an all-zero q8_0 block: d = 0, q = 0
    k[1, 1, 5] = 4000.0  # one large value in a block
    kv = allocate_kv(6, 4, kvh, hd, kv_type)
    store_kv(kv, k, v, np.arange(n, dtype=np.int32))
    assert kv.kv_type == kv_type
    got_k, got_v = _stored(kv, n)
    if kv_type == "f32":
        np.testing.assert_array_equal(got_k, k)
    elif kv_type == "f16":
        kk = kv.k.reshape(-1, kvh, hd)[:n]
        np.testing.assert_array_equal(kk.view(np.uint16), k.astype(np.float16).view(np.uint16))
        np.testing.assert_array_equal(got_v, v.astype(np.float16).astype(np.float64))
    else:
        blocks = quantize(k.reshape(n * kvh, hd), T.Q8_0).reshape(n, kvh, hd // 32, 34)  # d f16 | 32 x int8
        np.testing.assert_array_equal(kv.k_scale.reshape(-1, kvh, hd // 32)[:n],
                                      blocks[..., :2].copy().view(np.float16)[..., 0])
        np.testing.assert_array_equal(kv.k.reshape(-1, kvh, hd)[:n],
                                      blocks[..., 2:].copy().view(np.int8).reshape(n, kvh, hd))
        assert np.all(got_k[0, 0, :32] == 0)
        # the numpy reference backend stores the same bits
        ref = numpy_ops.allocate_kv(6, 4, kvh, hd, kv_type)
        numpy_ops.store_kv(ref, k, v, np.arange(n))
        np.testing.assert_array_equal(ref.v, kv.v)
        np.testing.assert_array_equal(ref.v_scale, kv.v_scale)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_values_past_float16_saturate(kv_type):
    """A key past float16's range is held as +-65504 (q8_0: its scale, the values at +-127 d), not
    inf: one inf key made the row's logits NaN. An f16 NaN stays NaN."""
    kvh, hd = 1, 64
    k = np.ones((2, kvh, hd), np.float32)
    k[0, 0, :3] = [1e6, -3e38, 70000.0]
    k[1, 0, 32:] = 2e7  # a whole q8_0 block past 65504 * 127
    k[1, 0, 0] = np.nan
    kv = allocate_kv(1, 4, kvh, hd, kv_type)
    store_kv(kv, k, k, np.arange(2, dtype=np.int32))
    got, _ = _stored(kv, 2)
    assert np.isfinite(got[0]).all() and np.isfinite(got[1, 0, 32:]).all()
    if kv_type == "f16":
        assert got[0, 0, :3].tolist() == [65504.0, -65504.0, 65504.0]
        assert np.isnan(got[1, 0, 0])
    else:
        assert (got[1, 0, 32:] == 127 * 65504.0).all()
        assert got[0, 0, :2].tolist() == [15 * 65504.0, -127 * 65504.0]  # d = 65504: 1e6 / d rounds to 15


def _rounding_bound(q, k_seq, v_seq, k_held, v_held, positions, seq_of_tok, scale, g):
    """Largest move of any output (token, head) that rounding K/V to the held values can cause."""
    worst = 0.0
    for t, (s, p) in enumerate(zip(seq_of_tok, positions)):
        dk = k_held[s][: p + 1] - k_seq[s][: p + 1]  # [keys, kvh, hd]
        dv = np.abs(v_held[s][: p + 1] - v_seq[s][: p + 1]).max()
        vmax = np.abs(v_held[s][: p + 1]).max()
        for h in range(q.shape[1]):
            eps = np.abs(dk[:, h // g] @ q[t, h].astype(np.float64)).max() * scale
            worst = max(worst, dv + np.expm1(2 * eps) * vmax)
    return worst


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("seqs", [MIXED, [(600, 1)]])  # one-chunk tokens; a chunked decode
def test_attention_reads_the_held_values(kv_type, seqs):
    rng = np.random.default_rng(2)
    g, hd, scale = 2, 64, 0.125
    q, kv, batch, k_seq, v_seq, seq_of_tok = make_case(rng, 16, 2, g, hd, seqs, kv_type)
    # the held values, per sequence in position order: store the same rows in a fresh contiguous cache
    k_held, v_held = [], []
    for ks, vs in zip(k_seq, v_seq):
        c = allocate_kv(-(-ks.shape[0] // 16), 16, 2, hd, kv_type)
        store_kv(c, ks, vs, np.arange(ks.shape[0], dtype=np.int32))
        kh, vh = _stored(c, ks.shape[0])
        k_held.append(kh)
        v_held.append(vh)
    out = attention(q, kv, batch, scale)
    held = ref_attention(q, k_held, v_held, batch.positions, seq_of_tok, scale, 0, 0.0)
    assert np.abs(out - held).max() <= 1e-5
    exact = ref_attention(q, k_seq, v_seq, batch.positions, seq_of_tok, scale, 0, 0.0)
    bound = _rounding_bound(q, k_seq, v_seq, k_held, v_held, batch.positions, seq_of_tok, scale, g)
    moved = np.abs(out - exact).max()
    assert moved <= bound + 1e-5
    assert moved > 1e-5  # the rounding is visible: the kernel read the held values, not float32 ones
    np.testing.assert_allclose(numpy_ops.attention(q, kv, batch, scale), held, atol=1e-5)


def test_bytes_and_bad_types():
    assert kv_row_bytes("f16", 64) * 2 == kv_row_bytes("f32", 64)
    assert kv_row_bytes("q8_0", 256) * 128 == kv_row_bytes("f32", 256) * 34
    kv = allocate_kv(3, 4, 2, 64, "q8_0")
    held = kv.k.nbytes + kv.k_scale.nbytes
    assert held == 3 * 4 * 2 * kv_row_bytes("q8_0", 64)
    with pytest.raises(ValueError, match="--kv-type must be one of f32, f16, q8_0"):
        allocate_kv(3, 4, 2, 64, "q4_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        check_kv_type("q8_0", 48)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_pool_is_resident_when_allocated(kv_type):
    # a lazily mapped pool grows RSS as the LRU free queue reaches new blocks: every page is touched up front
    before = _rss_kib()
    kv = allocate_kv(4096, 16, 8, 128, kv_type)  # 64 Mi elements a plane: past glibc's mmap threshold
    grown = (_rss_kib() - before) * 1024
    planes = [kv.k, kv.v] + ([kv.k_scale, kv.v_scale] if kv.k_scale is not None else [])
    assert grown >= 0.9 * sum(p.nbytes for p in planes)
    assert all(not p.any() for p in planes)
