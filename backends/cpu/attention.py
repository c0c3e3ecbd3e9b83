"""Paged causal attention over a block-table KV cache (prefill, decode and mixed batches), float32.

Work is split into items (token, kv head, key chunk): each item reads its K/V rows once for all
query heads sharing that kv head (GQA), computes exact scores for its chunk, and keeps (max, sum,
weighted V) so chunks of one token combine exactly (flash-decoding). A single decode gets several
chunks so both cores stream the context. Chunks are a fixed number of keys, so results never
depend on the batch a token shares (batch invariance).
"""

import math

import numba as nb
import numpy as np

from edged.backends.base import Batch, LayerKV, kv_shape
from edged.backends.cpu.fastexp import exp_nonpos as _exp_nonpos

_FM = {"reassoc", "contract", "nsz", "arcp"}  # no nnan/ninf: the -inf sentinel must stay exact
# Keys per chunk, fixed so a token's chunk boundaries (and so its rounding) depend on the token
# alone, never on the batch around it: the same request gives the same output in any batch.
_CHUNK = 256


def allocate_kv(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int) -> LayerKV:
    """One layer's paged KV cache: K and V float32 [num_blocks, block_size, n_kv_heads, head_dim]."""
    shape = kv_shape(num_blocks, block_size, n_kv_heads, head_dim)
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


# Register tiles: 4 query heads x 4 keys share each loaded K/V element across 16 FMAs, which
# halves the loads per FMA of a one-key-at-a-time loop (measured ~2x faster per key at hd 256).


@nb.njit(inline="always", fastmath=_FM)
def _dot(a, b):
    """a . b for float32 [hd] rows, vectorized (reassociated) sum."""
    s = np.float32(0.0)
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@nb.njit(inline="always", fastmath=_FM)
def _scores_4x4(qg, h, k0, k1, k2, k3, sc, jj, scale):
    """sc[h:h+4, jj:jj+4] = qg[h:h+4] . [k0..k3] * scale; qg [g, hd], k rows [hd]."""
    q0 = qg[h]
    q1 = qg[h + 1]
    q2 = qg[h + 2]
    q3 = qg[h + 3]
    s00 = s01 = s02 = s03 = np.float32(0.0)
    s10 = s11 = s12 = s13 = np.float32(0.0)
    s20 = s21 = s22 = s23 = np.float32(0.0)
    s30 = s31 = s32 = s33 = np.float32(0.0)
    for d in range(q0.shape[0]):
        a0 = k0[d]
        a1 = k1[d]
        a2 = k2[d]
        a3 = k3[d]
        b = q0[d]
        s00 += b * a0
        s01 += b * a1
        s02 += b * a2
        s03 += b * a3
        b = q1[d]
        s10 += b * a0
        s11 += b * a1
        s12 += b * a2
        s13 += b * a3
        b = q2[d]
        s20 += b * a0
        s21 += b * a1
        s22 += b * a2
        s23 += b * a3
        b = q3[d]
        s30 += b * a0
        s31 += b * a1
        s32 += b * a2
        s33 += b * a3
    sc[h, jj] = s00 * scale
    sc[h, jj + 1] = s01 * scale
    sc[h, jj + 2] = s02 * scale
    sc[h, jj + 3] = s03 * scale
    sc[h + 1, jj] = s10 * scale
    sc[h + 1, jj + 1] = s11 * scale
    sc[h + 1, jj + 2] = s12 * scale
    sc[h + 1, jj + 3] = s13 * scale
    sc[h + 2, jj] = s20 * scale
    sc[h + 2, jj + 1] = s21 * scale
    sc[h + 2, jj + 2] = s22 * scale
    sc[h + 2, jj + 3] = s23 * scale
    sc[h + 3, jj] = s30 * scale
    sc[h + 3, jj + 1] = s31 * scale
    sc[h + 3, jj + 2] = s32 * scale
    sc[h + 3, jj + 3] = s33 * scale


@nb.njit(inline="always", fastmath=_FM)
def _scores_1x4(qr, k0, k1, k2, k3, sr, jj, scale):
    """sr[jj:jj+4] = qr . [k0..k3] * scale for one head's query row qr [hd]."""
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for d in range(qr.shape[0]):
        b = qr[d]
        s0 += b * k0[d]
        s1 += b * k1[d]
        s2 += b * k2[d]
        s3 += b * k3[d]
    sr[jj] = s0 * scale
    sr[jj + 1] = s1 * scale
    sr[jj + 2] = s2 * scale
    sr[jj + 3] = s3 * scale


@nb.njit(inline="always", fastmath=_FM)
def _weigh_4x4(acc, h, sc, jj, v0, v1, v2, v3):
    """acc[h:h+4] += sc[h:h+4, jj:jj+4] @ [v0..v3]; acc [g, hd], v rows [hd]."""
    p00 = sc[h, jj]
    p01 = sc[h, jj + 1]
    p02 = sc[h, jj + 2]
    p03 = sc[h, jj + 3]
    p10 = sc[h + 1, jj]
    p11 = sc[h + 1, jj + 1]
    p12 = sc[h + 1, jj + 2]
    p13 = sc[h + 1, jj + 3]
    p20 = sc[h + 2, jj]
    p21 = sc[h + 2, jj + 1]
    p22 = sc[h + 2, jj + 2]
    p23 = sc[h + 2, jj + 3]
    p30 = sc[h + 3, jj]
    p31 = sc[h + 3, jj + 1]
    p32 = sc[h + 3, jj + 2]
    p33 = sc[h + 3, jj + 3]
    a0 = acc[h]
    a1 = acc[h + 1]
    a2 = acc[h + 2]
    a3 = acc[h + 3]
    for d in range(a0.shape[0]):
        x0 = v0[d]
        x1 = v1[d]
        x2 = v2[d]
        x3 = v3[d]
        a0[d] += p00 * x0 + p01 * x1 + p02 * x2 + p03 * x3
        a1[d] += p10 * x0 + p11 * x1 + p12 * x2 + p13 * x3
        a2[d] += p20 * x0 + p21 * x1 + p22 * x2 + p23 * x3
        a3[d] += p30 * x0 + p31 * x1 + p32 * x2 + p33 * x3


@nb.njit(inline="always", fastmath=_FM)
def _weigh_1x4(ar, sr, jj, v0, v1, v2, v3):
    """ar += sr[jj:jj+4] @ [v0..v3] for one head's accumulator row ar [hd]."""
    p0 = sr[jj]
    p1 = sr[jj + 1]
    p2 = sr[jj + 2]
    p3 = sr[jj + 3]
    for d in range(ar.shape[0]):
        ar[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d]


@nb.njit(inline="always", fastmath=_FM)
def _axpy(y, a, x):
    """y += a * x over float32 [hd] rows."""
    for i in range(y.shape[0]):
        y[i] += a * x[i]


@nb.njit(inline="always", fastmath=_FM)
def _score_keys(qg, kc, blk, kh, o0, o1, sc, base, scale):
    """Scores of keys at offsets o0..o1-1 of block blk into sc[:, base + o] (qg [g, hd])."""
    g = qg.shape[0]
    o = o0
    while o + 4 <= o1:
        k0 = kc[blk, o, kh]
        k1 = kc[blk, o + 1, kh]
        k2 = kc[blk, o + 2, kh]
        k3 = kc[blk, o + 3, kh]
        h = 0
        while h + 4 <= g:
            _scores_4x4(qg, h, k0, k1, k2, k3, sc, base + o, scale)
            h += 4
        while h < g:
            _scores_1x4(qg[h], k0, k1, k2, k3, sc[h], base + o, scale)
            h += 1
        o += 4
    while o < o1:
        krow = kc[blk, o, kh]  # [hd]
        for h in range(g):
            sc[h, base + o] = _dot(qg[h], krow) * scale
        o += 1


@nb.njit(inline="always", fastmath=_FM)
def _weigh_values(acc, vc, blk, kh, o0, o1, sc, base):
    """acc [g, hd] += probabilities sc[:, base + o] times V rows at offsets o0..o1-1 of blk."""
    g = acc.shape[0]
    o = o0
    while o + 4 <= o1:
        v0 = vc[blk, o, kh]
        v1 = vc[blk, o + 1, kh]
        v2 = vc[blk, o + 2, kh]
        v3 = vc[blk, o + 3, kh]
        h = 0
        while h + 4 <= g:
            _weigh_4x4(acc, h, sc, base + o, v0, v1, v2, v3)
            h += 4
        while h < g:
            _weigh_1x4(acc[h], sc[h], base + o, v0, v1, v2, v3)
            h += 1
        o += 4
    while o < o1:
        vrow = vc[blk, o, kh]  # [hd]
        for h in range(g):
            _axpy(acc[h], sc[h, base + o], vrow)
        o += 1


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FM)
def _attention_chunks(q, kc, vc, block_tables, seq_starts, positions, window, chunk, n_chunks,
                      scale, cap, out, part_m, part_l, part_acc, err):
    """Score chunks of each token's visible keys and reduce them to (max, sum, weighted V).

    q [n, h, hd]; kc/vc [nb, bs, kvh, hd]; block_tables [n_seqs, max_blocks]; seq_starts
    [n_seqs + 1]; positions [n].
    Item it = (token, kv head, chunk c) covers keys lo + c*chunk .. of the token's range [lo, p].
    With n_chunks == 1 the normalized result goes straight to out [n, h, hd]; otherwise each item
    writes part_m/part_l [n, h, n_chunks] and part_acc [n, h, n_chunks, hd] for _combine_chunks.
    """
    n, n_heads, hd = q.shape
    n_blocks, bs, kvh, _ = kc.shape
    max_blocks = block_tables.shape[1]
    g = n_heads // kvh
    n_items = n * kvh * n_chunks
    for it0 in nb.prange(n_items):
        # zigzag order: prange hands each thread a contiguous range, and a causal prefill's work
        # grows with t; pairing the shortest with the longest items balances the threads
        it = it0 // 2 if it0 % 2 == 0 else n_items - 1 - it0 // 2
        t = it // (kvh * n_chunks)
        kh = (it // n_chunks) % kvh
        c = it % n_chunks
        s = np.searchsorted(seq_starts, t, side="right") - 1  # the sequence owning token t
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
        qg = q[t, h0 : h0 + g]  # [g, hd] query heads sharing kv head kh
        # pass 1: scores; each K row is read once for all g query heads, block by block
        ok = True
        j = j0
        while j < j1:
            bi = j // bs
            blk = block_tables[s, bi] if bi < max_blocks else -1
            if blk < 0 or blk >= n_blocks:
                ok = False
                break
            o_end = min(bs, j1 - bi * bs)
            _score_keys(qg, kc, blk, kh, j - bi * bs, o_end, sc, bi * bs - j0, scale)
            j = bi * bs + o_end
        if not ok:
            err[0] = 1  # bad block table: the caller raises, the result is not used
            continue
        # pass 2: softmax numerators within the chunk
        for hh in range(g):
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
        # pass 3: probability-weighted V rows, each read once for all g heads
        acc = np.zeros((g, hd), dtype=np.float32)  # [g, hd]
        j = j0
        while j < j1:
            bi = j // bs
            blk = block_tables[s, bi]
            o_end = min(bs, j1 - bi * bs)
            _weigh_values(acc, vc, blk, kh, j - bi * bs, o_end, sc, bi * bs - j0)
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
        mx = np.float32(-np.inf)
        for c in range(n_chunks):
            if part_l[t, h, c] > 0:
                mx = max(mx, part_m[t, h, c])
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
    if n_chunks == 1:
        part_m = np.empty((n, h, 1), dtype=np.float32)
        part_l = np.empty((n, h, 1), dtype=np.float32)
        part_acc = np.empty((1, 1, 1, 1), dtype=np.float32)
    else:
        part_m = np.empty((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_l = np.empty((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_acc = np.empty((n, h, n_chunks, hd), dtype=np.float32)  # [n, h, chunks, hd]
    err = np.zeros(1, dtype=np.int32)
    _attention_chunks(q, kv.k, kv.v, block_tables, seq_starts, positions, int(window), chunk,
                      n_chunks, np.float32(scale), np.float32(softcap), out, part_m, part_l,
                      part_acc, err)
    if err[0]:
        raise ValueError("attention: a block table entry needed by a position is missing or out of range")
    if n_chunks > 1:
        _combine_chunks(part_m, part_l, part_acc, out)
    return out
