"""Paged attention against dense numpy causal softmax attention over the unpaged K/V.

Caches use shuffled, non-contiguous block ids; batches mix one prefill chunk that starts
mid-sequence (earlier context already cached) with several decodes. Bound: max abs error
<= 1e-5 (outputs are softmax averages of N(0, 1) values; float32 dots over head_dim <= 256)
against float64 attention over the values the cache holds; f16 / q8_0 caches: those values are
the stored rows read back, and their distance from the float32 rows is bounded separately
(test_kv_types.py).
"""

import numpy as np
import pytest

from edged.backends.base import Batch
from edged.backends.cpu import allocate_kv, attention, store_kv

ATOL = 1e-5


def ref_attention(q, k_seq, v_seq, positions, seq_of_tok, scale, window, softcap, sinks=None):
    """Dense float64 reference: token t attends to keys j <= p (and p - j < window) of its sequence;
    sinks [h] add e^sink to head h's softmax denominator."""
    n, h, hd = q.shape
    kvh = k_seq[0].shape[1]
    g = h // kvh
    out = np.zeros((n, h, hd))
    for t in range(n):
        s, p = seq_of_tok[t], positions[t]
        lo = max(0, p - window + 1) if window > 0 else 0
        for head in range(h):
            k = k_seq[s][lo : p + 1, head // g].astype(np.float64)  # [keys, hd]
            v = v_seq[s][lo : p + 1, head // g].astype(np.float64)
            logits = k @ q[t, head].astype(np.float64) * scale
            if softcap > 0:
                logits = softcap * np.tanh(logits / softcap)
            m = logits.max() if sinks is None else max(logits.max(), float(sinks[head]))
            w = np.exp(logits - m)
            denom = w.sum() + (0.0 if sinks is None else np.exp(float(sinks[head]) - m))
            out[t, head] = w @ v / denom
    return out


def make_case(rng, bs, kvh, g, hd, seqs, kv_type="f32"):
    """seqs: list of (cached, new) token counts. Returns q, kv (of kv_type), batch and the dense
    float32 K/V per sequence (as written: an f16 / q8_0 cache holds them rounded).

    Each sequence's blocks are drawn from a shuffled pool; cached tokens are stored first (an
    earlier step), then this step's tokens through batch.slot_mapping.
    """
    lens = [c + m for c, m in seqs]
    n_blocks_seq = [-(-L // bs) for L in lens]
    pool = rng.permutation(sum(n_blocks_seq) + 5).astype(np.int32)  # spare blocks stay unused
    max_blocks = max(n_blocks_seq) + 2
    tables = np.full((len(seqs), max_blocks), -1, dtype=np.int32)
    kv = allocate_kv(pool.shape[0], bs, kvh, hd, kv_type)
    k_seq, v_seq = [], []
    positions, slots, seq_of_tok, starts = [], [], [], [0]
    used = 0
    for s, ((cached, new), L) in enumerate(zip(seqs, lens)):
        tables[s, : n_blocks_seq[s]] = pool[used : used + n_blocks_seq[s]]
        used += n_blocks_seq[s]
        k_seq.append(rng.standard_normal((L, kvh, hd)).astype(np.float32))
        v_seq.append(rng.standard_normal((L, kvh, hd)).astype(np.float32))
        slot = tables[s, np.arange(L) // bs] * bs + np.arange(L) % bs  # [L]
        store_kv(kv, k_seq[s][:cached], v_seq[s][:cached], slot[:cached])
        positions += list(range(cached, L))
        slots += list(slot[cached:])
        seq_of_tok += [s] * new
        starts.append(starts[-1] + new)
    n = len(positions)
    batch = Batch(
        token_ids=np.zeros(n, dtype=np.int32),
        positions=np.array(positions, dtype=np.int32),
        seq_starts=np.array(starts, dtype=np.int32),
        seq_lens=np.array(lens, dtype=np.int32),
        block_tables=tables,
        slot_mapping=np.array(slots, dtype=np.int32),
        logits_indices=np.array(starts[1:], dtype=np.int32) - 1,
        block_size=bs,
    )
    k_new = np.concatenate([k_seq[s][c:] for s, (c, _) in enumerate(seqs)])  # [n, kvh, hd]
    v_new = np.concatenate([v_seq[s][c:] for s, (c, _) in enumerate(seqs)])
    store_kv(kv, k_new, v_new, batch.slot_mapping)
    q = rng.standard_normal((n, kvh * g, hd)).astype(np.float32)
    return q, kv, batch, k_seq, v_seq, np.array(seq_of_tok)


# one prefill chunk starting at position 11, then decodes with contexts 1, 6, 40
MIXED = [(11, 9), (0, 1), (5, 1), (39, 1)]


@pytest.mark.parametrize("bs", [16, 3])
@pytest.mark.parametrize("kvh,g", [(2, 1), (1, 4)])
@pytest.mark.parametrize("hd", [64, 256])
@pytest.mark.parametrize("window", [0, 5])
def test_mixed_batch_matches_dense(bs, kvh, g, hd, window):
    rng = np.random.default_rng(bs * 1000 + kvh * 100 + hd + window)
    q, kv, batch, k_seq, v_seq, seq_of_tok = make_case(rng, bs, kvh, g, hd, MIXED)
    scale = hd**-0.5
    out = attention(q, kv, batch, scale, window=window)
    ref = ref_attention(q, k_seq, v_seq, batch.positions, seq_of_tok, scale, window, 0.0)
    assert out.shape == q.shape and out.dtype == np.float32
    assert np.abs(out - ref).max() <= ATOL


@pytest.mark.parametrize("window", [0, 5])
def test_softcap(window):
    rng = np.random.default_rng(7)
    q, kv, batch, k_seq, v_seq, seq_of_tok = make_case(rng, 3, 1, 4, 64, MIXED)
    q *= 4  # logits large enough for the cap to matter
    out = attention(q, kv, batch, 0.125, window=window, softcap=2.0)
    ref = ref_attention(q, k_seq, v_seq, batch.positions, seq_of_tok, 0.125, window, 2.0)
    assert np.abs(out - ref).max() <= ATOL
    uncapped = attention(q, kv, batch, 0.125, window=window)
    assert np.abs(out - uncapped).max() > 1e-2


@pytest.mark.parametrize("seqs,window", [([(700, 1)], 0), ([(700, 1)], 300), ([(500, 1), (260, 1)], 0)])
def test_long_decode_split_into_chunks(seqs, window):
    """Few decodes over long contexts take the chunked (flash-decoding) path."""
    rng = np.random.default_rng(len(seqs) + window)
    q, kv, batch, k_seq, v_seq, seq_of_tok = make_case(rng, 16, 1, 4, 64, seqs)
    out = attention(q, kv, batch, 0.125, window=window)
    ref = ref_attention(q, k_seq, v_seq, batch.positions, seq_of_tok, 0.125, window, 0.0)
    assert np.abs(out - ref).max() <= ATOL


@pytest.mark.parametrize("seqs", [MIXED, [(700, 1), (3, 1)]])
def test_sinks(seqs):
    """Sinks (some below, some above the logits) join the denominator only, in one-chunk and
    chunked tokens; numpy_ops (the test backend) agrees."""
    from tests.helpers import numpy_ops

    rng = np.random.default_rng(11)
    q, kv, batch, k_seq, v_seq, seq_of_tok = make_case(rng, 16, 2, 2, 64, seqs)
    sinks = np.array([-3.0, 0.5, 2.0, 6.0], dtype=np.float32)  # [h]
    out = attention(q, kv, batch, 0.125, sinks=sinks)
    ref = ref_attention(q, k_seq, v_seq, batch.positions, seq_of_tok, 0.125, 0, 0.0, sinks)
    assert np.abs(out - ref).max() <= ATOL
    assert np.abs(numpy_ops.attention(q, kv, batch, 0.125, sinks=sinks) - ref).max() <= ATOL
    assert np.abs(out - attention(q, kv, batch, 0.125)).max() > 1e-2  # the sinks matter
    with pytest.raises(ValueError, match="sinks shape"):
        attention(q, kv, batch, 0.125, sinks=sinks[:3])


def test_sinks_result_independent_of_batch():
    """A short decode with sinks gives the same bits alone and beside a 700-key decode (which
    makes the batch chunked)."""
    rng = np.random.default_rng(12)
    q, kv, batch, *_ = make_case(rng, 16, 1, 2, 64, [(700, 1), (5, 1)])
    sinks = np.array([0.3, 1.5], dtype=np.float32)
    both = attention(q, kv, batch, 0.125, sinks=sinks)
    alone = Batch(token_ids=batch.token_ids[1:], positions=batch.positions[1:],
                  seq_starts=np.array([0, 1], np.int32), seq_lens=batch.seq_lens[1:],
                  block_tables=batch.block_tables[1:], slot_mapping=batch.slot_mapping[1:],
                  logits_indices=np.zeros(1, np.int32), block_size=16)
    np.testing.assert_array_equal(attention(q[1:], kv, alone, 0.125, sinks=sinks), both[1:])


def test_store_kv_places_rows_by_slot_and_skips_negative():
    kv = allocate_kv(4, 3, 2, 8)
    k = np.arange(3 * 2 * 8, dtype=np.float32).reshape(3, 2, 8)
    store_kv(kv, k, -k, np.array([7, -1, 0], dtype=np.int32))
    np.testing.assert_array_equal(kv.k[2, 1], k[0])  # slot 7 = block 2, offset 1
    np.testing.assert_array_equal(kv.v[0, 0], -k[2])
    assert np.count_nonzero(kv.k) == 2 * 2 * 8 - 1  # k[2] has one zero element; k[1] skipped


def test_bad_inputs_are_clear_errors():
    rng = np.random.default_rng(3)
    q, kv, batch, *_ = make_case(rng, 16, 2, 2, 64, [(20, 1)])
    with pytest.raises(ValueError, match="slot out of range"):
        store_kv(kv, q[:, :2], q[:, :2], np.array([kv.k.shape[0] * 16], dtype=np.int32))
    with pytest.raises(ValueError, match="multiple"):
        attention(q[:, :3], kv, batch, 0.1)
    batch.seq_starts = np.array([0, 2], dtype=np.int32)  # claims 2 tokens, q has 1
    with pytest.raises(ValueError, match="partition"):
        attention(q, kv, batch, 0.1)
    batch.seq_starts = np.array([0, 1], dtype=np.int32)
    batch.block_tables = batch.block_tables.copy()
    batch.block_tables[0, 1] = -1  # position 20 needs block 1
    with pytest.raises(ValueError, match="block table"):
        attention(q, kv, batch, 0.1)


def test_exp_nonpos_relative_error():
    """The softmax's vectorizable exp: relative error < 4e-7 down to e^-87."""
    import numba as nb

    from edged.backends.cpu.fastexp import exp_nonpos

    @nb.njit
    def run(x, y):
        for i in range(x.shape[0]):
            y[i] = exp_nonpos(x[i])

    x = -np.random.default_rng(0).uniform(0, 87, 20000).astype(np.float32)
    x[:4] = [0.0, -1e-8, -0.34657359, -87.0]
    y = np.empty_like(x)
    run(x, y)
    ref = np.exp(x.astype(np.float64))
    assert (np.abs(y - ref) / ref).max() < 4e-7
