"""Paged causal attention over a block-table KV cache (prefill, decode and mixed batches), float32.

Work is split into items (token, kv head, key chunk): each item reads its K/V rows once for all
query heads sharing that kv head (GQA), computes exact scores for its chunk, and keeps (max, sum,
weighted V) so chunks of one token combine exactly (flash-decoding). A single decode gets several
chunks so both cores stream the context; a prefill gets one chunk per token and writes directly.
"""

import math

import numba as nb
import numpy as np

from edged.backends.base import Batch, LayerKV

_FM = {"reassoc", "contract", "nsz", "arcp"}  # no nnan/ninf: the -inf sentinel must stay exact
_MIN_CHUNK = 128  # keys per chunk below which splitting a token costs more than it saves


def allocate_kv(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int) -> LayerKV:
    """One layer's paged KV cache: K and V float32 [num_blocks, block_size, n_kv_heads, head_dim]."""
    for name, v in (("num_blocks", num_blocks), ("block_size", block_size),
                    ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
        if int(v) <= 0:
            raise ValueError(f"allocate_kv: {name} must be > 0, got {v}")
    shape = (int(num_blocks), int(block_size), int(n_kv_heads), int(head_dim))
    return LayerKV(k=np.zeros(shape, dtype=np.float32), v=np.zeros(shape, dtype=np.float32))


@nb.njit(parallel=True, nogil=True, cache=True)
def _store_kv(kc, vc, k, v, slots):
    """Write k/v [n, kvh, hd] rows to kc/vc [nb, bs, kvh, hd] at slots; returns #bad slots."""
    n_blocks, bs, kvh, hd = kc.shape
    cap = n_blocks * bs
    bad = 0
    for i in nb.prange(k.shape[0]):
        s = slots[i]
        if s < 0:
            continue  # padding token: nothing to store
        if s >= cap:
            bad += 1
            continue
        b = s // bs
        o = s - b * bs
        for h in range(kvh):
            for d in range(hd):
                kc[b, o, h, d] = k[i, h, d]
                vc[b, o, h, d] = v[i, h, d]
    return bad


def store_kv(kv: LayerKV, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Write this step's K/V rows [n, kvh, hd] into the paged cache.

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
    if _store_kv(kv.k, kv.v, k, v, slots):
        raise ValueError(f"store_kv: slot out of range (cache holds {kv.k.shape[0] * kv.k.shape[1]} slots)")


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FM)
def _attention_chunks(q, kc, vc, block_tables, tok_seq, positions, window, chunk, n_chunks,
                      scale, cap, out, part_m, part_l, part_acc, err):
    """Score chunks of each token's visible keys and reduce them to (max, sum, weighted V).

    q [n, h, hd]; kc/vc [nb, bs, kvh, hd]; block_tables [n_seqs, max_blocks]; tok_seq/positions [n].
    Item it = (token, kv head, chunk c) covers keys lo + c*chunk .. of the token's range [lo, p].
    With n_chunks == 1 the normalized result goes straight to out [n, h, hd]; otherwise each item
    writes part_m/part_l [n, h, n_chunks] and part_acc [n, h, n_chunks, hd] for _combine_chunks.
    """
    n, n_heads, hd = q.shape
    n_blocks, bs, kvh, _ = kc.shape
    max_blocks = block_tables.shape[1]
    g = n_heads // kvh
    n_items = n * kvh * n_chunks
    for it in nb.prange(n_items):
        t = it // (kvh * n_chunks)
        kh = (it // n_chunks) % kvh
        c = it % n_chunks
        s = tok_seq[t]
        p = positions[t]
        lo = 0
        if window > 0 and p - window + 1 > 0:
            lo = p - window + 1
        j0 = lo + c * chunk
        j1 = min(j0 + chunk, p + 1)
        h0 = kh * g
        if j0 >= j1:  # this token has fewer chunks: an empty item
            for hh in range(g):
                part_m[t, h0 + hh, c] = -np.inf
                part_l[t, h0 + hh, c] = np.float32(0.0)
            continue
        nk = j1 - j0
        sc = np.empty((g, nk), dtype=np.float32)  # [g, nk] scores, then probabilities
        acc = np.zeros((g, hd), dtype=np.float32)  # [g, hd]
        # pass 1: scores, one K row read per key for all g query heads; walk block by block
        j = j0
        while j < j1:
            bi = j // bs
            if bi >= max_blocks:
                err[0] = 1
                break
            blk = block_tables[s, bi]
            if blk < 0 or blk >= n_blocks:
                err[0] = 1
                break
            o_end = min(bs, j1 - bi * bs)
            for o in range(j - bi * bs, o_end):
                jj = bi * bs + o - j0
                for hh in range(g):
                    dot = np.float32(0.0)
                    for d in range(hd):
                        dot += q[t, h0 + hh, d] * kc[blk, o, kh, d]
                    x = dot * scale
                    if cap > 0:
                        x = cap * np.float32(math.tanh(x / cap))
                    sc[hh, jj] = x
            j = bi * bs + o_end
        if j < j1:
            continue  # bad block table: err is set, result is not used
        # pass 2: softmax numerators within the chunk
        for hh in range(g):
            m = sc[hh, 0]
            for jj in range(1, nk):
                m = max(m, sc[hh, jj])
            l = np.float32(0.0)
            for jj in range(nk):
                e = np.float32(math.exp(sc[hh, jj] - m))
                sc[hh, jj] = e
                l += e
            part_m[t, h0 + hh, c] = m
            part_l[t, h0 + hh, c] = l
        # pass 3: probability-weighted V rows, one V row read per key for all g heads
        j = j0
        while j < j1:
            bi = j // bs
            blk = block_tables[s, bi]
            o_end = min(bs, j1 - bi * bs)
            for o in range(j - bi * bs, o_end):
                jj = bi * bs + o - j0
                for hh in range(g):
                    pr = sc[hh, jj]
                    for d in range(hd):
                        acc[hh, d] += pr * vc[blk, o, kh, d]
            j = bi * bs + o_end
        if n_chunks == 1:
            for hh in range(g):
                inv = np.float32(1.0) / part_l[t, h0 + hh, 0]
                for d in range(hd):
                    out[t, h0 + hh, d] = acc[hh, d] * inv
        else:
            for hh in range(g):
                for d in range(hd):
                    part_acc[t, h0 + hh, c, d] = acc[hh, d]


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FM)
def _combine_chunks(part_m, part_l, part_acc, out):
    """out[t, h] = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c over a token's chunks."""
    n, n_heads, n_chunks, hd = part_acc.shape
    for th in nb.prange(n * n_heads):
        t = th // n_heads
        h = th % n_heads
        mx = -np.inf
        for c in range(n_chunks):
            if part_l[t, h, c] > 0:
                mx = max(mx, part_m[t, h, c])
        for d in range(hd):
            out[t, h, d] = np.float32(0.0)
        tot = np.float32(0.0)
        for c in range(n_chunks):
            if part_l[t, h, c] > 0:
                w = np.float32(math.exp(part_m[t, h, c] - mx))
                tot += w * part_l[t, h, c]
                for d in range(hd):
                    out[t, h, d] += w * part_acc[t, h, c, d]
        inv = np.float32(1.0) / tot
        for d in range(hd):
            out[t, h, d] *= inv


def _token_seq(seq_starts: np.ndarray, n: int) -> np.ndarray:
    """int32 [n]: the sequence index of each token of the flat batch."""
    counts = np.diff(seq_starts)
    if counts.min(initial=0) < 0 or int(seq_starts[0]) != 0 or int(seq_starts[-1]) != n:
        raise ValueError(f"attention: seq_starts {seq_starts} do not partition {n} tokens")
    return np.repeat(np.arange(counts.shape[0], dtype=np.int32), counts)


def _plan_chunks(positions: np.ndarray, window: int, n_items_base: int) -> tuple[int, int]:
    """(chunk, n_chunks): split each token's keys only when tokens x kv heads cannot fill the cores."""
    max_keys = int(positions.max()) + 1
    if window > 0:
        max_keys = min(max_keys, window)
    want = 4 * nb.get_num_threads()  # a few items per thread evens out unequal chunks
    if n_items_base >= want or max_keys <= _MIN_CHUNK:
        return max_keys, 1
    n_chunks = min(-(-want // n_items_base), -(-max_keys // _MIN_CHUNK))
    chunk = -(-max_keys // n_chunks)
    return chunk, -(-max_keys // chunk)


def attention(
    q: np.ndarray, kv: LayerKV, batch: Batch, scale: float, window: int = 0, softcap: float = 0.0
) -> np.ndarray:
    """Causal attention of q [n, h, hd] over the paged cache -> [n, h, hd] (float32).

    Token t of sequence s at position p = batch.positions[t] attends to keys 0..p of s (only
    p - j < window when window > 0), read through batch.block_tables[s]; the current step's K/V
    must already be stored (store_kv). Query head h uses kv head h // (h / kvh). Logits are
    q.k * scale, then softcap * tanh(logit / softcap) when softcap > 0, then softmax.
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
    if int(positions.min()) < 0:
        raise ValueError("attention: negative position")
    q = np.ascontiguousarray(q, dtype=np.float32)
    tok_seq = _token_seq(np.asarray(batch.seq_starts), n)
    block_tables = np.ascontiguousarray(batch.block_tables, dtype=np.int32)
    chunk, n_chunks = _plan_chunks(positions, int(window), n * kvh)
    h = q.shape[1]
    if n_chunks == 1:
        part_m = np.empty((n, h, 1), dtype=np.float32)
        part_l = np.empty((n, h, 1), dtype=np.float32)
        part_acc = np.empty((1, 1, 1, 1), dtype=np.float32)
    else:
        part_m = np.empty((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_l = np.empty((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_acc = np.empty((n, h, n_chunks, hd), dtype=np.float32)  # [n, h, chunks, hd]
    err = np.zeros(1, dtype=np.int32)
    _attention_chunks(q, kv.k, kv.v, block_tables, tok_seq, positions, int(window), chunk,
                      n_chunks, np.float32(scale), np.float32(softcap), out, part_m, part_l,
                      part_acc, err)
    if err[0]:
        raise ValueError("attention: a block table entry needed by a position is missing or out of range")
    if n_chunks > 1:
        _combine_chunks(part_m, part_l, part_acc, out)
    return out
