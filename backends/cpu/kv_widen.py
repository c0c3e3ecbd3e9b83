"""A prefill's f16 / q8_0 cache blocks widened to float32 once, for attention to read.

Attention widens each f16 / q8_0 K/V row where it reads it (kv_codec.kv_row), once per query
token that visits the row: a 512-token prefill widens every key row of its chunk ~256 times. When
a batch visits each row several times over, the blocks it reads are widened once here into a
float32 copy, and attention runs on that copy through a remapped block table. The copy holds
kv_row's own values, and attention's float32 path then gives the f16 / q8_0 path's bits when both
compiled variants come from the same place (test_kv_widen.py; docs/kernels.md on a variant
compiled in-process against one loaded from the cache).
"""

import numba as nb
import numpy as np

from edged.backends.cpu.attention_tiles import FM
from edged.backends.cpu.kv_codec import _NO_SCALES, kv_row

MIN_REUSE = 4  # (token, key) visits per widened row below which attention widens as it reads
# the largest float32 copy of one sequence's K and V: each token scans its sequence's visible rows,
# and a copy past the mid-level caches reads twice the bytes of the f16 rows it replaces (16k keys
# of context: 2.4x slower; 4k: 1.07x; 2k from the start: 0.93x, docs/kernels.md)
MAX_BYTES = 4 << 20
MAX_TOTAL_BYTES = 64 << 20  # ... and of the whole batch's


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=FM)
def _widen(cache, scales, blocks, out):
    """out [n_used, bs, kvh, hd] float32 = kv_row of every row of cache's blocks[u] (int32 [n_used])."""
    bs, kvh, hd = cache.shape[1], cache.shape[2], cache.shape[3]
    for u in nb.prange(blocks.shape[0]):
        buf = np.empty((5, hd), dtype=np.float32)  # [5, hd] kv_row's scratch
        for o in range(bs):
            for kh in range(kvh):
                row = kv_row(cache, scales, blocks[u], o, kh, buf, 0)
                for d in range(hd):
                    out[u, o, kh, d] = row[d]


def widened(k, v, ks, vs, block_tables, seq_starts, positions, window):
    """(k32, v32, ks, vs, block_tables32) for attention over kernel arrays k, v, ks, vs (kv_codec.
    kernel_arrays of an f16 or q8_0 cache) with the batch's checked layout (attention._plan):
    the blocks the batch's tokens can see, widened, and the table rows pointing into them (-1
    elsewhere). None where widening would not pay (each row visited fewer than MIN_REUSE times
    on average, a sequence's copy over MAX_BYTES, the whole over MAX_TOTAL_BYTES) or a needed
    table entry is bad: the caller then runs on the cache itself, which reports the bad entry."""
    n_blocks, bs, kvh, hd = k.shape
    max_blocks = block_tables.shape[1]
    # a row's visits are at most its sequence's tokens in the batch: a decode step stops here
    if np.diff(seq_starts).max(initial=0) < MIN_REUSE:
        return None
    lo = positions - window + 1 if window > 0 else np.zeros_like(positions)
    lo = np.maximum(lo, 0)  # [n] each token's first visible key
    visits = int((positions + 1 - lo).sum())
    spans = []  # (sequence, first block, last block) of each sequence with tokens here
    for s in range(seq_starts.shape[0] - 1):
        t0, t1 = seq_starts[s], seq_starts[s + 1]
        if t0 < t1:
            spans.append((s, int(lo[t0:t1].min()) // bs, int(positions[t0:t1].max()) // bs))
    if not spans or max(b1 for _, _, b1 in spans) >= max_blocks:
        return None
    blocks = [b1 - b0 + 1 for _, b0, b1 in spans]
    row_bytes = 2 * kvh * hd * 4  # a K and a V row in float32
    if (visits < MIN_REUSE * sum(blocks) * bs or max(blocks) * bs * row_bytes > MAX_BYTES
            or sum(blocks) * bs * row_bytes > MAX_TOTAL_BYTES):
        return None
    ids = np.concatenate([block_tables[s, b0 : b1 + 1] for s, b0, b1 in spans])
    if ids.min() < 0 or ids.max() >= n_blocks:
        return None
    used, where = np.unique(ids, return_inverse=True)  # blocks shared by prefix caching widened once
    used = used.astype(np.int32)
    table = np.full(block_tables.shape, -1, dtype=np.int32)  # [n_seqs, max_blocks]
    at = np.cumsum([0] + blocks)
    for (s, b0, b1), a0, a1 in zip(spans, at[:-1], at[1:]):
        table[s, b0 : b1 + 1] = where[a0:a1]
    k32 = np.empty((used.shape[0], bs, kvh, hd), dtype=np.float32)  # [n_used, bs, kvh, hd]
    v32 = np.empty_like(k32)
    _widen(k, ks, used, k32)
    _widen(v, vs, used, v32)
    return k32, v32, _NO_SCALES, _NO_SCALES, table
