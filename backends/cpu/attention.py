"""Paged causal attention over a block-table KV cache (prefill, decode and mixed batches), float32
arithmetic over an f32, f16 or q8_0 cache (kv_codec.py: rows widened as they are read).

Work is split into items (token, kv head, key chunk): each item reads its K/V rows once for all
query heads sharing that kv head (GQA), computes exact scores for its chunk, and keeps (max, sum,
weighted V) so chunks of one token combine exactly (flash-decoding). A single decode gets several
chunks so every core streams part of the context. Chunks are a fixed number of keys, so results
never depend on the batch a token shares (batch invariance). The 4 x 4 register tiles that score
keys and weigh V rows are in attention_tiles.py.
"""

import math

import numba as nb
import numpy as np

from edged.backends.base import KV_DEFAULT, Batch, LayerKV, check_sinks, key_chunk
from edged.backends.cpu import kv_codec, kv_widen
from edged.backends.cpu.attention_tiles import FM, score_keys, weigh_values
from edged.backends.cpu.fastexp import exp_nonpos as _exp_nonpos

_key_chunk = nb.njit(inline="always")(key_chunk)

# Keys per chunk, fixed so a token's chunk boundaries (and so its rounding) depend on the token
# alone, never on the batch around it: the same request gives the same output in any batch.
_CHUNK = 256


def allocate_kv(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                kv_type: str = KV_DEFAULT) -> LayerKV:
    """One layer's zeroed paged KV cache: K and V [num_blocks, block_size, n_kv_heads, head_dim]
    of kv_type (f32, f16, q8_0: see LayerKV)."""
    return kv_codec.allocate(num_blocks, block_size, n_kv_heads, head_dim, kv_type)


def store_kv(kv: LayerKV, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Write this step's K/V rows [n, kvh, hd] into the paged cache, converted to its type.

    Token i goes to block slot_mapping[i] // block_size, offset slot_mapping[i] % block_size;
    a negative slot skips the token (padding).
    """
    _, _, kvh, hd = kv.k.shape
    if k.ndim != 3 or k.shape[1:] != (kvh, hd) or v.shape != k.shape:
        raise ValueError(f"store_kv: k {k.shape} / v {v.shape} must be [n, {kvh}, {hd}]")
    slots = np.ascontiguousarray(slot_mapping, dtype=np.int32)
    if slots.shape != (k.shape[0],):
        raise ValueError(f"store_kv: slot_mapping shape {slots.shape} != ({k.shape[0]},)")
    k = np.ascontiguousarray(k, dtype=np.float32)
    v = np.ascontiguousarray(v, dtype=np.float32)
    if kv_codec.store_rows(*kv_codec.kernel_arrays(kv), k, v, slots):
        raise ValueError(f"store_kv: slot out of range (cache holds {kv.k.shape[0] * kv.k.shape[1]} slots)")


@nb.njit(inline="always")
def _work_item(it0, n_items, kvh, n_chunks):
    """(token, kv head, chunk) of the it0-th item in zigzag order.

    prange hands each thread a contiguous range, and a causal prefill's work grows with the token;
    pairing the shortest items with the longest balances the threads.
    """
    it = it0 // 2 if it0 % 2 == 0 else n_items - 1 - it0 // 2
    return it // (kvh * n_chunks), (it // n_chunks) % kvh, it % n_chunks


@nb.njit(inline="always")
def _chunk_keys(seq_starts, positions, t, window, c, chunk):
    """(sequence owning token t, first key, end key) of chunk c of t's visible keys."""
    s = np.searchsorted(seq_starts, t, side="right") - 1
    j0, j1 = _key_chunk(positions[t], window, c, chunk)
    return s, j0, j1


@nb.njit(inline="always", fastmath=FM)
def _score_chunk(qg, kc, ks, block_tables, s, kh, j0, j1, sc, scale, buf):
    """sc [g, j1 - j0] = scores of keys j0..j1-1 of sequence s; False on a bad block-table entry.

    Keys are walked block by block, so each K row is read (and widened into buf) once for all g
    query heads.
    """
    n_blocks, bs = kc.shape[0], kc.shape[1]
    max_blocks = block_tables.shape[1]
    j = j0
    while j < j1:
        bi = j // bs
        blk = block_tables[s, bi] if bi < max_blocks else -1
        if blk < 0 or blk >= n_blocks:
            return False
        o_end = min(bs, j1 - bi * bs)
        score_keys(qg, kc, ks, blk, kh, j - bi * bs, o_end, sc, bi * bs - j0, scale, buf)
        j = bi * bs + o_end
    return True


@nb.njit(inline="always", fastmath=FM)
def _softmax_chunk(sc, cap, part_m, part_l, t, h0, c):
    """Soft-cap sc's scores (cap > 0), turn them into e^(score - max) in place, and record each
    head's max and sum in part_m / part_l[t, h0 + head, c]."""
    nk = sc.shape[1]
    for hh in range(sc.shape[0]):
        row = sc[hh]  # [nk]
        if cap > 0:
            for jj in range(nk):
                row[jj] = cap * np.float32(math.tanh(row[jj] / cap))
        m = row[0]
        for jj in range(1, nk):
            m = max(m, row[jj])
        l = np.float32(0.0)
        for jj in range(nk):
            e = _exp_nonpos(row[jj] - m)
            row[jj] = e
            l += e
        part_m[t, h0 + hh, c] = m
        part_l[t, h0 + hh, c] = l


@nb.njit(inline="always", fastmath=FM)
def _weigh_chunk(acc, vc, vs, block_tables, s, kh, j0, j1, sc, buf):
    """acc [g, hd] += sc's probabilities times V rows j0..j1-1, each read once for all g heads
    (the block table was checked by _score_chunk)."""
    bs = vc.shape[1]
    j = j0
    while j < j1:
        bi = j // bs
        blk = block_tables[s, bi]
        o_end = min(bs, j1 - bi * bs)
        weigh_values(acc, vc, vs, blk, kh, j - bi * bs, o_end, sc, bi * bs - j0, np.float32(1.0), buf)
        j = bi * bs + o_end


@nb.njit(inline="always", fastmath=FM)
def _write_item(acc, t, h0, c, direct, part_l, out, part_acc):
    """direct: out[t, h0:h0+g] = acc / sum; else acc kept in part_acc for _combine_chunks."""
    g, hd = acc.shape
    if direct:
        for hh in range(g):
            inv = np.float32(1.0) / part_l[t, h0 + hh, 0]
            for d in range(hd):
                out[t, h0 + hh, d] = acc[hh, d] * inv
    else:
        for hh in range(g):
            for d in range(hd):
                part_acc[t, h0 + hh, c, d] = acc[hh, d]


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=FM)
def _attention_chunks(q, kc, vc, ks, vs, block_tables, seq_starts, positions, window, chunk, n_chunks,
                      direct, scale, cap, out, part_m, part_l, part_acc, err):
    """Score chunks of each token's visible keys and reduce them to (max, sum, weighted V).

    q [n, h, hd]; kc/vc [nb, bs, kvh, hd] float32, uint16 (f16 bits) or int8 (q8_0, scales ks/vs
    [nb, bs, kvh, hd / 32] f16 bits); block_tables [n_seqs, max_blocks]; seq_starts [n_seqs + 1];
    positions [n].
    Item it = (token, kv head, chunk c) covers keys lo + c*chunk .. of the token's range [lo, p].
    With direct (one chunk, no sinks) the normalized result goes straight to out [n, h, hd];
    otherwise each item writes part_m/part_l [n, h, n_chunks] and part_acc [n, h, n_chunks, hd]
    for _combine_chunks.
    """
    n, n_heads, hd = q.shape
    kvh = kc.shape[2]
    g = n_heads // kvh
    n_items = n * kvh * n_chunks
    for it0 in nb.prange(n_items):
        t, kh, c = _work_item(it0, n_items, kvh, n_chunks)
        s, j0, j1 = _chunk_keys(seq_starts, positions, t, window, c, chunk)
        h0 = kh * g
        if j0 >= j1:  # this token has fewer chunks: an empty item
            for hh in range(g):
                part_m[t, h0 + hh, c] = -np.inf
                part_l[t, h0 + hh, c] = np.float32(0.0)
            continue
        sc = np.empty((g, j1 - j0), dtype=np.float32)  # [g, nk] scores, then probabilities
        buf = np.empty((5, hd), dtype=np.float32)  # [5, hd] K/V rows widened from f16 / q8_0 (kv_row)
        qg = q[t, h0 : h0 + g]  # [g, hd] query heads sharing kv head kh
        if not _score_chunk(qg, kc, ks, block_tables, s, kh, j0, j1, sc, scale, buf):
            err[0] = 1  # bad block table: the caller raises, the result is not used
            continue
        _softmax_chunk(sc, cap, part_m, part_l, t, h0, c)
        acc = np.zeros((g, hd), dtype=np.float32)  # [g, hd]
        _weigh_chunk(acc, vc, vs, block_tables, s, kh, j0, j1, sc, buf)
        _write_item(acc, t, h0, c, direct, part_l, out, part_acc)


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=FM)
def _combine_chunks(part_m, part_l, part_acc, sinks, out):
    """out[t, h] = sum_c e^(m_c - M) acc_c / (sum_c e^(m_c - M) l_c + e^(sinks[h] - M)) over a
    token's chunks, M the largest m_c (and sink); sinks float32 [h], or [0] for none."""
    n, n_heads, n_chunks, hd = part_acc.shape
    has_sinks = sinks.shape[0] > 0
    for th in nb.prange(n * n_heads):
        t = th // n_heads
        h = th % n_heads
        mx = np.float32(-np.inf)
        for c in range(n_chunks):
            if part_l[t, h, c] > 0:
                mx = max(mx, part_m[t, h, c])
        if has_sinks:
            mx = max(mx, sinks[h])
        for d in range(hd):
            out[t, h, d] = np.float32(0.0)
        tot = np.float32(0.0)
        for c in range(n_chunks):
            if part_l[t, h, c] > 0:
                # exactly 1 for the max chunk: a one-chunk token equals the unsplit path bit for bit
                w = np.float32(1.0) if part_m[t, h, c] == mx else _exp_nonpos(part_m[t, h, c] - mx)
                tot += w * part_l[t, h, c]
                for d in range(hd):
                    out[t, h, d] += w * part_acc[t, h, c, d]
        if has_sinks:  # the sink's logit joins the denominator only (gpt-oss attention sinks)
            tot += np.float32(1.0) if sinks[h] == mx else _exp_nonpos(sinks[h] - mx)
        inv = np.float32(1.0) / tot
        for d in range(hd):
            out[t, h, d] *= inv


@nb.njit(nogil=True, cache=True)
def _plan(positions, seq_starts, n_table_rows, window, chunk):
    """Check the batch layout and return (chunk, n_chunks); chunk < 0 flags a bad layout.

    Every token's keys are cut at the same fixed offsets lo + c*chunk, whatever else is in the
    batch; n_chunks covers the longest token (shorter ones get empty items).
    """
    n = positions.shape[0]
    n_seqs = seq_starts.shape[0] - 1
    if n_seqs < 1 or n_seqs > n_table_rows or seq_starts[0] != 0 or seq_starts[n_seqs] != n:
        return -1, 0
    for i in range(n_seqs):
        if seq_starts[i + 1] < seq_starts[i]:
            return -1, 0
    max_keys = 0
    for t in range(n):
        if positions[t] < 0:
            return -2, 0
        max_keys = max(max_keys, positions[t] + 1)
    if window > 0:
        max_keys = min(max_keys, window)
    return chunk, max(1, -(-max_keys // chunk))


def attention(
    q: np.ndarray, kv: LayerKV, batch: Batch, scale: float, window: int = 0, softcap: float = 0.0,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Causal attention of q [n, h, hd] over the paged cache -> [n, h, hd] (float32).

    Token t of sequence s at position p = batch.positions[t] attends to keys 0..p of s (only
    p - j < window when window > 0), read through batch.block_tables[s]; the current step's K/V
    must already be stored (store_kv). Query head h uses kv head h // (h / kvh). Logits are
    q.k * scale, then softcap * tanh(logit / softcap) when softcap > 0, then softmax. sinks
    (float32 [h], gpt-oss): head h's softmax denominator also holds e^sinks[h], a logit with no value.
    """
    n_blocks, bs, kvh, hd = kv.k.shape
    if q.ndim != 3 or q.shape[2] != hd or q.shape[1] % kvh:
        raise ValueError(f"attention: q {q.shape} must be [n, h, {hd}] with h a multiple of {kvh}")
    n = q.shape[0]
    if batch.block_size != bs:
        raise ValueError(f"attention: batch block_size {batch.block_size} != cache block size {bs}")
    positions = np.ascontiguousarray(batch.positions, dtype=np.int32)
    if positions.shape != (n,):
        raise ValueError(f"attention: positions shape {positions.shape} != ({n},)")
    out = np.empty(q.shape, dtype=np.float32)  # [n, h, hd]
    if n == 0:
        return out
    q = np.ascontiguousarray(q, dtype=np.float32)
    seq_starts = np.ascontiguousarray(batch.seq_starts, dtype=np.int32)
    block_tables = np.ascontiguousarray(batch.block_tables, dtype=np.int32)
    if block_tables.ndim != 2:
        raise ValueError(f"attention: block_tables must be [n_seqs, max_blocks], got {block_tables.shape}")
    chunk, n_chunks = _plan(positions, seq_starts, block_tables.shape[0], int(window), _CHUNK)
    if chunk == -1:
        raise ValueError(f"attention: seq_starts {seq_starts} do not partition {n} tokens "
                         f"over the {block_tables.shape[0]} block-table rows")
    if chunk == -2:
        raise ValueError("attention: negative position")
    h = q.shape[1]
    sinks = check_sinks(sinks, h)
    # a one-chunk token normalizes in place; sinks always go through _combine_chunks, so a token's
    # result is the same whether the batch splits others into chunks or not
    direct = n_chunks == 1 and sinks.shape[0] == 0
    if direct:
        part_m = np.empty((n, h, 1), dtype=np.float32)
        part_l = np.empty((n, h, 1), dtype=np.float32)
        part_acc = np.empty((1, 1, 1, 1), dtype=np.float32)
    else:
        part_m = np.empty((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_l = np.empty((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_acc = np.empty((n, h, n_chunks, hd), dtype=np.float32)  # [n, h, chunks, hd]
    err = np.zeros(1, dtype=np.int32)
    cache = kv_codec.kernel_arrays(kv)
    if cache[0].dtype != np.float32:  # a prefill reads each row many times: widen its blocks once
        wide = kv_widen.widened(*cache, block_tables, seq_starts, positions, int(window))
        if wide is not None:
            cache, block_tables = wide[:4], wide[4]
    _attention_chunks(q, *cache, block_tables, seq_starts, positions, int(window), chunk, n_chunks, direct,
                      np.float32(scale), np.float32(softcap), out, part_m, part_l, part_acc, err)
    if err[0]:
        raise ValueError("attention: a block table entry needed by a position is missing or out of range")
    if not direct:
        _combine_chunks(part_m, part_l, part_acc, sinks, out)
    return out
