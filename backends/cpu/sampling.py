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


def warm_up() -> None:
    """Compile (or load from the on-disk cache) both kernels, so a first sampled request does not
    pay the JIT inside an engine step."""
    row = np.zeros(3, dtype=np.float32)
    softmax_denominator(row, np.float32(0.0), np.float32(1.0))
    draw_softmax(row, np.float32(0.0), np.float32(1.0), 0.5)
