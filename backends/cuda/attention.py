"""Paged causal attention on the device, plus its KV cache (allocate_kv, store_kv) and batch upload.

Same maths as backends/cpu/attention.py: token t of sequence s at position p attends to keys
lo..p of s (lo = p - window + 1 when window > 0), read through block_tables[s]; logits are
q·k · scale, then softcap · tanh(logit / softcap) when softcap > 0, then softmax; query head h reads
kv head h // (h / kvh) (GQA).

Kernel: one thread block per (token, kv head, chunk of CHUNK keys). The g = h / kvh query heads
sharing the kv head sit in shared memory; keys are visited in tiles of blockDim keys (one key per
thread scores all g heads), each tile's probabilities update a running max / sum per head (online
softmax) and the accumulators, which threads own per (head, feature) so V rows are read
coalesced. Several chunks of a token are merged by _combine_chunks (flash-decoding). A block-table
entry that is missing or out of range gives the token NaN outputs (checked on the host instead
when the table is a host array: see prepare_batch).

KV types (edged.backends.base.KV_TYPES), as on the CPU: float32, float16 (stored round to nearest
even), q8_0 (int8 values and a float16 scale d = amax / 127 per 32 features, q = rint(x / d));
kernels widen each element as they read it (_kv_at).
"""

import dataclasses
import functools
import math

import numpy as np
from numba import cuda, float32, int8, int32

from edged.backends.base import F16_MAX, KV_DEFAULT, Q8_KV_BLOCK, Batch, LayerKV, check_kv_type, check_sinks, key_chunk, kv_shape
from edged.backends.cuda.launch import SIM, launch_1d
from edged.backends.cuda.memory import as_device, is_device

ATT_THREADS = 32 if SIM else 128  # keys per tile = threads per block (the simulator runs a thread per Python thread)
_MAX_THREADS = 128
MAX_G = 16  # query heads per kv head
ACC_MAX = 16  # accumulator entries per thread: g · head_dim <= ACC_MAX · ATT_THREADS
MAX_GHD = ACC_MAX * _MAX_THREADS
# Keys per thread block: a long context is split over several blocks (flash-decoding), so a decode
# step still fills the device; partial results are combined by _combine_chunks.
CHUNK = 2 * ATT_THREADS

_key_chunk = cuda.jit(device=True, inline=True)(key_chunk)


@cuda.jit
def _zero(a):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] = 0


def _zeroed(shape, dtype):
    """A device array of zeros (set on the device: no host buffer)."""
    a = cuda.device_array(shape, dtype=dtype)
    size = int(np.prod(shape))
    blocks, threads = launch_1d(size)
    _zero[blocks, threads](a.reshape(size))
    return a


def allocate_kv(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                kv_type: str = KV_DEFAULT) -> LayerKV:
    """One layer's zeroed paged KV cache on the device: k, v [num_blocks, block_size, kvh, hd] of
    kv_type (float32, float16, or int8 with float16 scales [.., hd / 32] for q8_0: see LayerKV)."""
    shape = kv_shape(num_blocks, block_size, n_kv_heads, head_dim)
    check_kv_type(kv_type, shape[3])
    if kv_type == "q8_0":
        sshape = (*shape[:3], shape[3] // Q8_KV_BLOCK)
        return LayerKV(k=_zeroed(shape, np.int8), v=_zeroed(shape, np.int8),
                       k_scale=_zeroed(sshape, np.float16), v_scale=_zeroed(sshape, np.float16))
    dtype = np.float32 if kv_type == "f32" else np.float16
    return LayerKV(k=_zeroed(shape, dtype), v=_zeroed(shape, dtype))


@cuda.jit(device=True, inline=True)
def _held(x, limit):
    """x within +-limit (F16_MAX for an f16 cache, inf for f32); NaN compares false and stays NaN."""
    if x > limit:
        return limit
    if x < -limit:
        return -limit
    return x


@cuda.jit
def _store_kv(kc, vc, k, v, slots, limit):
    """One thread per (token, kv feature); negative slots (padding) and slots past the cache are
    skipped. f32 / f16 caches (the store rounds to float16, to nearest even, saturating at limit
    as the CPU's does)."""
    n_blocks, bs, kvh, hd = kc.shape
    per = kvh * hd
    i = cuda.grid(1)
    if i >= k.shape[0] * per:
        return
    t = i // per
    s = slots[t]
    if s < 0 or s >= n_blocks * bs:
        return
    h = (i % per) // hd
    d = i % hd
    kc[s // bs, s % bs, h, d] = _held(k[t, h, d], limit)
    vc[s // bs, s % bs, h, d] = _held(v[t, h, d], limit)


@cuda.jit(device=True, inline=True)
def _put_q8(c, sc, b, o, h, blk, x, t):
    """c[b, o, h, 32 blk ..] and its scale sc[b, o, h, blk] from x[t, h, 32 blk ..] as
    quantize_row_q8_0: d = amax / 127, q = rint(x * (1 / d)) (0 for an all-zero block); d saturates
    at F16_MAX and q at +-127, as the CPU's store."""
    base = blk * 32
    amax = float32(0.0)
    for j in range(32):
        amax = max(amax, abs(x[t, h, base + j]))
    d = amax / float32(127.0)
    if d > float32(F16_MAX):  # the values saturate at +-127 d below
        d = float32(F16_MAX)
    inv = float32(1.0) / d if d > float32(0.0) else float32(0.0)
    for j in range(32):
        q = round(x[t, h, base + j] * inv)  # round(): half to even
        c[b, o, h, base + j] = int8(min(max(q, float32(-127.0)), float32(127.0)))
    sc[b, o, h, blk] = d


@cuda.jit
def _store_kv_q8(kc, vc, ks, vs, k, v, slots):
    """q8_0 caches: one thread per (token, kv head, block of 32 features); slots as _store_kv."""
    n_blocks, bs, kvh, hd = kc.shape
    per = kvh * (hd // 32)
    i = cuda.grid(1)
    if i >= k.shape[0] * per:
        return
    t = i // per
    s = slots[t]
    if s < 0 or s >= n_blocks * bs:
        return
    h = (i % per) // (hd // 32)
    blk = i % (hd // 32)
    _put_q8(kc, ks, s // bs, s % bs, h, blk, k, t)
    _put_q8(vc, vs, s // bs, s % bs, h, blk, v, t)


def store_kv(kv: LayerKV, k, v, slot_mapping) -> None:
    """Write this step's K/V rows [n, kvh, hd] into the paged device cache at slot_mapping int32 [n]
    (block = slot // block_size, offset = slot % block_size; negative slots are skipped). Host
    slot arrays are range-checked (ValueError); out-of-range slots of a device array are skipped."""
    _, bs, kvh, hd = kv.k.shape
    k = as_device(k, np.float32, "store_kv k")
    v = as_device(v, np.float32, "store_kv v")
    if k.ndim != 3 or tuple(k.shape[1:]) != (kvh, hd) or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"store_kv: k {tuple(k.shape)} / v {tuple(v.shape)} must be [n, {kvh}, {hd}]")
    if not is_device(slot_mapping):
        slots_h = np.asarray(slot_mapping)
        if slots_h.shape == (k.shape[0],) and np.any(slots_h >= kv.k.shape[0] * bs):
            raise ValueError(f"store_kv: slot out of range (cache holds {kv.k.shape[0] * bs} slots)")
    slots = as_device(slot_mapping, np.int32, "store_kv slot_mapping")
    if tuple(slots.shape) != (k.shape[0],):
        raise ValueError(f"store_kv: slot_mapping shape {tuple(slots.shape)} != ({k.shape[0]},)")
    if not k.shape[0]:
        return
    if kv.k_scale is None:
        blocks, threads = launch_1d(k.shape[0] * kvh * hd)
        limit = F16_MAX if kv.k.dtype == np.float16 else np.float32(np.inf)
        _store_kv[blocks, threads](kv.k, kv.v, k, v, slots, limit)
    else:
        blocks, threads = launch_1d(k.shape[0] * kvh * (hd // Q8_KV_BLOCK))
        _store_kv_q8[blocks, threads](kv.k, kv.v, kv.k_scale, kv.v_scale, k, v, slots)


def _check_layout(batch: Batch) -> None:
    """The CPU backend's batch checks, on host arrays: seq_starts partitions the tokens over the
    block-table rows, positions are >= 0, and every block a position needs is in the table."""
    positions = np.asarray(batch.positions)
    seq_starts = np.asarray(batch.seq_starts)
    tables = np.asarray(batch.block_tables)
    n = positions.shape[0]
    n_seqs = seq_starts.shape[0] - 1
    if tables.ndim != 2:
        raise ValueError(f"attention: block_tables must be [n_seqs, max_blocks], got {tables.shape}")
    if (n_seqs < 1 or n_seqs > tables.shape[0] or seq_starts[0] != 0 or seq_starts[n_seqs] != n
            or np.any(np.diff(seq_starts) < 0)):
        raise ValueError(f"attention: seq_starts {seq_starts} do not partition {n} tokens "
                         f"over the {tables.shape[0]} block-table rows")
    if np.any(positions < 0):
        raise ValueError("attention: negative position")
    for s in range(n_seqs):
        pos = positions[seq_starts[s]:seq_starts[s + 1]]
        if pos.size:
            need = int(pos.max()) // batch.block_size + 1
            if need > tables.shape[1] or np.any(tables[s, :need] < 0):
                raise ValueError("attention: a block table entry needed by a position is missing or out of range")


def prepare_batch(batch: Batch) -> Batch:
    """The same Batch with every array field on the device (one H2D copy each, int32), after the
    CPU backend's layout checks on the host arrays. Fields already on the device are kept."""
    if not any(is_device(getattr(batch, f.name)) for f in dataclasses.fields(batch)):
        _check_layout(batch)
    up = {}
    for f in dataclasses.fields(batch):
        val = getattr(batch, f.name)
        if isinstance(val, np.ndarray):
            up[f.name] = cuda.to_device(np.ascontiguousarray(val, dtype=np.int32))
    return dataclasses.replace(batch, **up)


@cuda.jit(device=True, inline=True)
def _key_range(seq_starts, positions, t, window, c, chunk):
    """(sequence owning token t, first key, end key) of chunk c of t's visible keys."""
    s = 0  # the last sequence starting at or before t
    for z in range(1, seq_starts.shape[0] - 1):
        if seq_starts[z] <= t:
            s = z
    k0, k1 = _key_chunk(positions[t], window, c, chunk)
    return s, k0, k1


@cuda.jit(device=True, inline=True)
def _kv_at(c, sc, blk, o, kh, z):
    """float32 value of cache element c[blk, o, kh, z]: f32 / f16 (sc empty) or q8_0 (times its scale)."""
    if sc.shape[0] == 0:
        return float32(c[blk, o, kh, z])
    return float32(c[blk, o, kh, z]) * float32(sc[blk, o, kh, z // 32])


@cuda.jit(device=True, inline=True)
def _score_tile(kc, ks, block_tables, s, kh, j, k1, sq, g, scale, cap, ssc, sblk, tid):
    """This thread's key j of the tile: ssc[:, tid] = capped scores for the g heads and sblk[tid]
    its cache block; -inf past k1 and NaN for a bad block-table entry (never read outside the cache)."""
    n_blocks, bs, _, hd = kc.shape
    if j >= k1:
        sblk[tid] = 0
        for hh in range(g):
            ssc[hh, tid] = -math.inf
        return
    bi = j // bs
    blk = block_tables[s, bi] if bi < block_tables.shape[1] else -1
    if blk < 0 or blk >= n_blocks:
        sblk[tid] = 0
        for hh in range(g):
            ssc[hh, tid] = float32(math.nan)
        return
    o = j % bs
    sblk[tid] = blk
    for hh in range(g):
        d = float32(0.0)
        for z in range(hd):
            d += sq[hh * hd + z] * _kv_at(kc, ks, blk, o, kh, z)
        v = d * scale
        if cap > float32(0.0):
            v = cap * float32(math.tanh(v / cap))
        ssc[hh, tid] = v


@cuda.jit(device=True, inline=True)
def _online_softmax(ssc, sm, sl, sal, h, nt):
    """Head h: fold the tile's scores into the running max sm / sum sl, leave the rescale factor of
    the earlier keys in sal and the tile's probabilities (relative to the new max) in ssc."""
    mt = sm[h]
    for z in range(nt):
        mt = max(mt, ssc[h, z])
    alpha = float32(math.exp(sm[h] - mt))
    total = sl[h] * alpha
    for z in range(nt):
        e = float32(math.exp(ssc[h, z] - mt))
        ssc[h, z] = e
        total += e
    sm[h] = mt
    sl[h] = total
    sal[h] = alpha


@cuda.jit(device=True, inline=True)
def _weigh_tile(acc, vc, vs, kh, j0, nk, ssc, sal, sblk, gh, tid, nt):
    """Rescale this thread's accumulators (head, feature) = tid + z·nt and add the tile's nk
    probability-weighted V rows (threads of a warp read consecutive features: coalesced)."""
    bs, hd = vc.shape[1], vc.shape[3]
    for z in range(ACC_MAX):
        e = tid + z * nt
        if e < gh:
            hh = e // hd
            dd = e % hd
            a = acc[z] * sal[hh]
            for kk in range(nk):
                a += ssc[hh, kk] * _kv_at(vc, vs, sblk[kk], (j0 + kk) % bs, kh, dd)
            acc[z] = a


@cuda.jit(device=True, inline=True)
def _sink_terms(m, sinks, h):
    """(weight of the keys' sum, sink's denominator term) for head h whose keys' max logit is m:
    (1, 0) without sinks ([0] array), else relative to max(m, sinks[h])."""
    if sinks.shape[0] == 0:
        return float32(1.0), float32(0.0)
    mx = max(m, sinks[h])
    return float32(math.exp(m - mx)), float32(math.exp(sinks[h] - mx))


@cuda.jit
def _attention(q, kc, vc, ks, vs, block_tables, seq_starts, positions, window, scale, cap, chunk, sinks,
               out, part_m, part_l, part_acc):
    """Grid (token, kv head, key chunk c): keys lo + c·chunk .. of the token's range [lo, p]. With
    one chunk the normalized result goes to out [n, h, hd]; otherwise each block leaves (max, sum,
    unnormalized weighted V) in part_m / part_l [n, h, chunks], part_acc [n, h, chunks, hd].
    sinks float32 [h] ([0]: none) add e^sink to a head's denominator. ks / vs: q8_0's scales
    [nb, bs, kvh, hd / 32], empty ([0, 1, 1, 1]) for f32 / f16 caches."""
    sq = cuda.shared.array(MAX_GHD, float32)  # [g, hd] the query heads of this kv head
    ssc = cuda.shared.array((MAX_G, _MAX_THREADS), float32)  # [g, tile] scores, then probabilities
    sblk = cuda.shared.array(_MAX_THREADS, int32)  # [tile] cache block of each key
    sm = cuda.shared.array(MAX_G, float32)  # running max per head
    sl = cuda.shared.array(MAX_G, float32)  # running sum per head
    sal = cuda.shared.array(MAX_G, float32)  # this tile's rescale factor per head
    acc = cuda.local.array(ACC_MAX, float32)
    t = cuda.blockIdx.x
    kh = cuda.blockIdx.y
    c = cuda.blockIdx.z
    n_chunks = cuda.gridDim.z
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    hd = q.shape[2]
    g = q.shape[1] // kc.shape[2]
    h0 = kh * g
    gh = g * hd
    s, k0, k1 = _key_range(seq_starts, positions, t, window, c, chunk)  # this block's keys k0 .. k1 - 1
    if k0 >= k1:  # the token has fewer chunks: an empty part (uniform across the block)
        if tid < g:
            part_m[t, h0 + tid, c] = -math.inf
            part_l[t, h0 + tid, c] = float32(0.0)
        return
    for e in range(tid, gh, nt):
        sq[e] = q[t, h0 + e // hd, e % hd]
    if tid < g:
        sm[tid] = -math.inf
        sl[tid] = float32(0.0)
    for z in range(ACC_MAX):
        acc[z] = float32(0.0)
    cuda.syncthreads()
    for j0 in range(k0, k1, nt):
        _score_tile(kc, ks, block_tables, s, kh, j0 + tid, k1, sq, g, scale, cap, ssc, sblk, tid)
        cuda.syncthreads()
        if tid < g:
            _online_softmax(ssc, sm, sl, sal, tid, nt)
        cuda.syncthreads()
        _weigh_tile(acc, vc, vs, kh, j0, min(nt, k1 - j0), ssc, sal, sblk, gh, tid, nt)
        cuda.syncthreads()
    for z in range(ACC_MAX):
        e = tid + z * nt
        if e < gh:
            if n_chunks == 1:
                w, ws = _sink_terms(sm[e // hd], sinks, h0 + e // hd)
                out[t, h0 + e // hd, e % hd] = acc[z] * w / (sl[e // hd] * w + ws)
            else:
                part_acc[t, h0 + e // hd, c, e % hd] = acc[z]
    if n_chunks > 1 and tid < g:
        part_m[t, h0 + tid, c] = sm[tid]
        part_l[t, h0 + tid, c] = sl[tid]


@cuda.jit
def _combine_chunks(part_m, part_l, part_acc, sinks, out):
    """out[t, h, d] = Σ_c e^(m_c - M) acc_c / (Σ_c e^(m_c - M) l_c + e^(sinks[h] - M)) over a
    token's non-empty chunks, M their largest m_c (and sink); one thread per output; the max
    chunk's weight is exactly 1, as on the CPU; sinks [0]: none."""
    n, n_heads, n_chunks, hd = part_acc.shape
    i = cuda.grid(1)
    if i >= n * n_heads * hd:
        return
    t = i // (n_heads * hd)
    h = (i // hd) % n_heads
    d = i % hd
    mx = float32(-math.inf)
    for c in range(n_chunks):
        if part_l[t, h, c] > float32(0.0):
            mx = max(mx, part_m[t, h, c])
    mx_keys = mx
    tot = float32(0.0)
    a = float32(0.0)
    for c in range(n_chunks):
        if part_l[t, h, c] > float32(0.0):
            w = float32(1.0) if part_m[t, h, c] == mx else float32(math.exp(part_m[t, h, c] - mx))
            tot += w * part_l[t, h, c]
            a += w * part_acc[t, h, c, d]
    if sinks.shape[0] > 0:
        mx = max(mx, sinks[h])
        wk = float32(math.exp(mx_keys - mx))
        tot = tot * wk + float32(math.exp(sinks[h] - mx))
        a = a * wk
    out[t, h, d] = a / tot


@functools.lru_cache(maxsize=None)
def _empty(shape: tuple, dtype) -> object:
    """An empty device array standing for "none" (no sinks, no q8_0 scales): made once, not at
    every layer of every step."""
    return cuda.device_array(shape, dtype=dtype)


def attention(q, kv: LayerKV, batch: Batch, scale: float, window: int = 0, softcap: float = 0.0,
              sinks=None):
    """Causal attention of device q float32 [n, h, hd] over the paged device cache -> new [n, h, hd].

    batch should come from prepare_batch (host arrays are checked and uploaded here instead); the
    current step's K/V must already be stored (store_kv). sinks (float32 [h], host or device, or
    None): a per-head logit in the softmax denominator only (gpt-oss)."""
    n_blocks, bs, kvh, hd = kv.k.shape
    q = as_device(q, np.float32, "attention q")
    if q.ndim != 3 or q.shape[2] != hd or q.shape[1] % kvh:
        raise ValueError(f"attention: q {tuple(q.shape)} must be [n, h, {hd}] with h a multiple of {kvh}")
    n, h = int(q.shape[0]), int(q.shape[1])
    if batch.block_size != bs:
        raise ValueError(f"attention: batch block_size {batch.block_size} != cache block size {bs}")
    g = h // kvh
    if g > MAX_G or g * hd > ACC_MAX * ATT_THREADS:
        raise ValueError(f"attention: {g} query heads per kv head x head_dim {hd} exceeds the kernel's "
                         f"limits ({MAX_G} heads, {ACC_MAX * ATT_THREADS} features)")
    if not is_device(batch.positions):
        batch = prepare_batch(batch)
    if tuple(batch.positions.shape) != (n,):
        raise ValueError(f"attention: positions shape {tuple(batch.positions.shape)} != ({n},)")
    if batch.block_tables.ndim != 2:
        raise ValueError(f"attention: block_tables must be [n_seqs, max_blocks], got {tuple(batch.block_tables.shape)}")
    if sinks is None:
        sinks = _empty((0,), np.float32)
    else:
        sinks = as_device(sinks if is_device(sinks) else check_sinks(sinks, h), np.float32, "attention sinks")
        if tuple(sinks.shape) != (h,):
            raise ValueError(f"attention: sinks shape {tuple(sinks.shape)} != ({h},) (one logit per query head)")
    out = cuda.device_array((n, h, hd), dtype=np.float32)  # [n, h, hd]
    if n == 0:
        return out
    # key chunks per token, from shapes alone (no device-to-host copy): the longest context the
    # block table can hold, or the window
    max_keys = int(batch.block_tables.shape[1]) * bs
    if window > 0:
        max_keys = min(max_keys, int(window))
    n_chunks = max(1, -(-max_keys // CHUNK))
    if n_chunks == 1:
        part_m = part_l = cuda.device_array((1, 1, 1), dtype=np.float32)
        part_acc = cuda.device_array((1, 1, 1, 1), dtype=np.float32)
    else:
        part_m = cuda.device_array((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_l = cuda.device_array((n, h, n_chunks), dtype=np.float32)  # [n, h, chunks]
        part_acc = cuda.device_array((n, h, n_chunks, hd), dtype=np.float32)  # [n, h, chunks, hd]
    # a real device launches no None argument: f32 / f16 caches pass empty scale planes
    ks = kv.k_scale if kv.k_scale is not None else _empty((0, 1, 1, 1), np.float16)
    vs = kv.v_scale if kv.v_scale is not None else ks
    _attention[(n, kvh, n_chunks), ATT_THREADS](
        q, kv.k, kv.v, ks, vs, batch.block_tables, batch.seq_starts, batch.positions, np.int32(window),
        np.float32(scale), np.float32(softcap), np.int32(CHUNK), sinks, out, part_m, part_l, part_acc)
    if n_chunks > 1:
        blocks, threads = launch_1d(n * h * hd)
        _combine_chunks[blocks, threads](part_m, part_l, part_acc, sinks, out)
    return out
