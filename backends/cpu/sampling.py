"""Numba kernels for sampling over full 262k-vocabulary rows: softmax denominators and one draw
from softmax(row / T), each a single vectorized pass with no [V]-sized temporaries.

numpy spent ~1.5 ms per row on `exp` + block sums for a plain temperature draw (scalar libm expf,
three temporaries); these use the vectorizable `exp_nonpos` of the CPU backend.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from edged.backends.cpu.fastexp import exp_nonpos

_FM = {"reassoc", "contract", "nsz", "arcp"}
DRAW_BLOCK = 1024  # tokens per partial sum in draw_softmax
_FLOOR = np.float32(-87.0)  # exp_nonpos clamps below this; these weights count as exactly 0


@nb.njit(inline="always", fastmath=_FM)
def _weight(x, mx, inv_t):
    z = (x - mx) * inv_t
    # a multiply by the mask, not a branch: the loops below stay vectorized
    return np.float32(exp_nonpos(z) * (z > _FLOOR))


@nb.njit(inline="always", fastmath=_FM)
def _block_sum(seg, mx, inv_t):
    # over a slice (not a lo..hi range of the row): LLVM vectorizes this form twice as well
    s = np.float32(0.0)
    for i in range(seg.shape[0]):
        s += _weight(seg[i], mx, inv_t)
    return s


@nb.njit(cache=True, nogil=True, fastmath=_FM)
def softmax_denominator(row, mx, inv_t):
    """sum_i exp((row[i] - mx) * inv_t) in float64 (float32 partial sums of 1024 terms).

    row float32 [V]; mx float32 >= every finite row value (the row's max); inv_t = 1 / temperature.
    """
    v = row.shape[0]
    mx = np.float32(mx)
    inv_t = np.float32(inv_t)
    total = 0.0
    for lo in range(0, v, DRAW_BLOCK):
        total += np.float64(_block_sum(row[lo : min(lo + DRAW_BLOCK, v)], mx, inv_t))
    return total


@nb.njit(cache=True, nogil=True, fastmath=_FM)
def draw_softmax(row, mx, inv_t, u):
    """Index i drawn with probability exp((row[i] - mx) * inv_t) / sum, for u uniform in [0, 1).

    One pass of block sums, then a walk through the chosen block: no cumulative sum of the
    whole row is built. Tokens whose weight is 0 (more than 87 nats below the max) are never drawn.
    """
    v = row.shape[0]
    mx = np.float32(mx)
    inv_t = np.float32(inv_t)
    nb_ = (v + DRAW_BLOCK - 1) // DRAW_BLOCK
    sums = np.empty(nb_, dtype=np.float64)  # [n_blocks]
    total = 0.0
    for b in range(nb_):
        lo = b * DRAW_BLOCK
        s = np.float64(_block_sum(row[lo : min(lo + DRAW_BLOCK, v)], mx, inv_t))
        sums[b] = s
        total += s
    target = u * total
    acc = 0.0
    last_b = -1
    for b in range(nb_):
        if sums[b] <= 0.0:
            continue
        last_b = b
        if acc + sums[b] <= target:
            acc += sums[b]
            continue
        lo = b * DRAW_BLOCK
        live = -1
        for i in range(lo, min(lo + DRAW_BLOCK, v)):
            w = _weight(row[i], mx, inv_t)
            if w > 0:
                live = i
                acc += w
                if acc > target:
                    return i
        return live  # rounding left the target just past this block's walk: its last live token
    # rounding pushed the target past the total: the last live token
    lo = last_b * DRAW_BLOCK
    for i in range(min(lo + DRAW_BLOCK, v) - 1, lo - 1, -1):
        if _weight(row[i], mx, inv_t) > 0:
            return i
    return -1


SCAN_CHUNK = 16384  # elements per chunk of rows_scan: the argmax's second look is one chunk
_EXP = np.int32(0x7F800000)  # a float32's exponent bits: all set = inf or NaN
_MAG = np.int32(0x7FFFFFFF)  # all but the sign bit


@nb.njit(inline="always")
def scan_chunk(bits, r, c, chunk, keys, bad):
    """keys[r, c] = the largest order key of chunk c of row r of int32 float bits [n, V] (a key
    whose signed order is the floats': u ^ ((u >> 31) & 0x7FFFFFFF), so -0.0 keys as -1, just
    below +0.0's 0); bad[r, c] = the chunk's largest magnitude bits (>= _EXP: an inf or NaN).
    Integer max / and / xor only: the loop vectorizes, and no fast-math flag can fold it away."""
    seg = bits[r, c * chunk : min(c * chunk + chunk, bits.shape[1])]
    k = np.int32(-2147483648)
    b = np.int32(0)
    for i in range(seg.shape[0]):
        u = seg[i]
        k = max(k, u ^ ((u >> 31) & _MAG))
        b = max(b, u & _MAG)
    keys[r, c] = k
    bad[r, c] = b


@nb.njit(cache=True, nogil=True)
def _chunk_scan(bits, chunk, keys, bad):
    """scan_chunk over every (row, chunk). Serial on purpose: it runs on the engine's thread, and
    an OpenMP team there would throttle the compute thread's team (edged/server/compute_thread.py);
    the server runs large scans on the compute thread instead (backends/cpu/rows_scan_parallel.py)."""
    nc = keys.shape[1]
    for t in range(bits.shape[0] * nc):
        scan_chunk(bits, t // nc, t % nc, chunk, keys, bad)


def rows_scan(logits: np.ndarray, argmax: bool = True, scan=_chunk_scan) -> tuple[np.ndarray | None, np.ndarray]:
    """(argmax int64 [n], finite bool [n]) of float32 logits [n, V] in one pass with no
    [n, V] temporary: the first index of each row's largest value (numpy's argmax where the row
    holds no NaN) and whether every value of the row is finite; argmax=False leaves the first None.
    scan: the (bits, chunk, keys, bad) kernel over every chunk (serial by default)."""
    n, v = logits.shape
    bits = np.ascontiguousarray(logits, dtype=np.float32).view(np.int32)  # [n, V]
    nc = max(1, -(-v // SCAN_CHUNK))
    keys = np.empty((n, nc), np.int32)  # [n, chunks]
    bad = np.empty((n, nc), np.int32)  # [n, chunks]
    scan(bits, SCAN_CHUNK, keys, bad)
    finite = ~(bad >= _EXP).any(axis=1)
    if not argmax:
        return None, finite
    keys[keys == -1] = 0  # -0.0 ties with +0.0, as numpy's argmax has it
    best = np.zeros(n, np.int64)
    top = keys.max(axis=1)
    for r in range(n):  # the first chunk holding the row's max, then the first index in it
        c = int(np.argmax(keys[r] == top[r]))
        lo = c * SCAN_CHUNK
        best[r] = lo + int(np.argmax(logits[r, lo : lo + SCAN_CHUNK]))
    return best, finite


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the kernels, so a first sampled request does not
    pay the JIT inside an engine step."""
    row = np.zeros(3, dtype=np.float32)
    softmax_denominator(row, np.float32(0.0), np.float32(1.0))
    draw_softmax(row, np.float32(0.0), np.float32(1.0), 0.5)
    rows_scan(row[None, :])
