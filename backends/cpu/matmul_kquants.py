"""CPU matmul kernels for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS.

Contract (backends/cpu/matmul.py): KERNELS[qtype] = (gemv, gemm), each
    f(w_rows uint8 [m, row_bytes], xq int8 [n, k], xd float32 [n, k/32], xs int32 [n, k/32],
      y float32 [n, m]) -> None.
Weights become unsigned bytes u with per-32 (or per-16) float scales s and biases c,
w_e = s·u_e + c, so each block dot is u8 × i8 → int32 (vpdpbusd) and
    Σ_e w_e x_e = xd · (s · Σ u·xq + c · Σ xq)   per block (per 16-half for per-16 biases).

- gemv (n <= matmul.GEMV_MAX_N): kquant_gemv.rows_dot per pair of rows and group of up to 4
  tokens: each superblock is unpacked once in registers for all the group's tokens. The CPU
  backend keeps its 2-D weights with an even row count in kquant_pairs' pair layout, where such
  a pair is one ascending stream (PAIRED_KERNELS; the same bits).
- gemm (larger n): rows decoded once by kquant_decode.decode_row into (u, s, c), then
  kquant_gemm_tile.tile_dot per 4 rows × 16-token tile (8-token tiles when a pass has at most 8
  tokens).
Both are one compiled kernel for every type (a run-time `kind` switches between the compiled
type bodies), bound per type by typed_kernel.bind. Q4_K / Q6_K carry the default model's layers.
Every type's gemv and gemm compute the same float operations in the same order per (row, token)
(see kquant_gemm_tile), so a token's output never depends on its batch (batch invariance).
The activation format is the contract's q8_32 (per-32 scales); a per-256 (Q8_K) format would
change _block_sums / _half_terms / _prepare_tiles and the block terms of the gemv and the tile.
"""

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.aligned import empty_aligned
from edged.backends.cpu.kernel_threads import SERIAL_TILE_BYTES, current_threads, fewer_threads, restore_threads
from edged.backends.cpu.kquant_decode import decode_row
from edged.backends.cpu.kquant_gemm_tile import TILE_ROWS, TOKENS, tile_dot
from edged.backends.cpu.kquant_gemv import GEMV_TOKENS, interleave_blocks, rows_dot
from edged.backends.cpu.kquant_unpack import (
    KIND_IQ4XS, KIND_Q2K, KIND_Q3K, KIND_Q4K, KIND_Q4KP, KIND_Q5K, KIND_Q5KP, KIND_Q6K,
)
from edged.backends.cpu.tile_store import store_quad
from edged.backends.cpu.typed_kernel import bind

QK_K = 256  # elements per superblock
GEMV_ROWS = 16  # rows per prange task in the gemv kernels
GEMM_ROWS = TILE_ROWS  # rows decoded together per gemm task and multiplied together per tile
# prange steps of the gemm row loop per thread; each allocates its scratch once (16 steps in all,
# against 2 a thread: 3-5% slower at n = 16 and n = 512 on Zen 4, docs/kernels.md)
GEMM_TASKS_PER_THREAD = 2
# tokens per pass over the weights: one pass's tiles (tokens · k bytes) stay within ~256 KiB of L2
_TILE_BYTES = 256 * 1024
# bytes past a row group's first byte that its first tile prefetches when the knob is 0 (-1: none),
# so the next groups' reads overlap the tile's arithmetic (as the legacy quads': docs/kernels.md)
GEMM_PREFETCH = 8192


# ------------------------------------------------------------------------------- gemv


@nb.njit(cache=True, nogil=True, inline="always")
def _block_sums(xd, xs):
    """float32 [n, k/32] activation scale × block sum (the per-32 bias term), computed exactly as
    _prepare_tiles does (batch invariance)."""
    n, nblk = xd.shape
    xm = np.empty((n, nblk), np.float32)
    for t in range(n):
        for b in range(nblk):
            xm[t, b] = xd[t, b] * np.float32(xs[t, b])
    return xm


@nb.njit(cache=True, nogil=True, inline="always")
def _int_bias(kind):
    """B of the per-16 types whose bias is c = -B·s (folded into the integer dots), else 0."""
    return 32 if kind == KIND_Q6K else (4 if kind == KIND_Q3K else 0)


@nb.njit(cache=True, nogil=True, inline="always")
def _half_terms(xq, xd, xs, ib):
    """(scale, bias term) float32 [n, k/16] per 16 activations (the per-16 types' terms), as
    _prepare_tiles computes them: the block scale d (twice per block) and d·lo, d·(block sum - lo),
    or with ib > 0 the int32 bits of ib·lo, ib·(block sum - lo)."""
    n, k = xq.shape
    n16 = k // 16
    xd16 = np.empty((n, n16), np.float32)  # [n, k/16]
    xs16 = np.empty((n, n16), np.float32)  # [n, k/16]
    xs16i = xs16.view(np.int32)
    for t in range(n):
        for b in range(k // 32):
            d = xd[t, b]
            lo = np.int32(0)
            for l in range(16):
                lo = np.int32(lo + np.int32(xq[t, 32 * b + l]))
            xd16[t, 2 * b] = d
            xd16[t, 2 * b + 1] = d
            if ib > 0:
                xs16i[t, 2 * b] = np.int32(ib * lo)
                xs16i[t, 2 * b + 1] = np.int32(ib * (xs[t, b] - lo))
            else:
                xs16[t, 2 * b] = d * np.float32(lo)
                xs16[t, 2 * b + 1] = d * np.float32(xs[t, b] - lo)
    return xd16, xs16


@nb.njit(cache=True, nogil=True, inline="always")
def _dup_last(a):
    """[n, c] -> [n + 1, c] with the last row repeated."""
    out = np.empty((a.shape[0] + 1, a.shape[1]), a.dtype)
    out[:-1] = a
    out[-1] = a[-1]
    return out


@nb.njit(cache=True, nogil=True, inline="always")
def gemv_operands(xq, xd, xs, kind):
    """rows_dot's activation operands of quantized x for weights of `kind`: the per-16 types take
    (xq, scale [n, k/16], bias term [n, k/16]); the others x in their block layout [n, k] and
    (scale, scale x block sum) [n, k/32]."""
    if kind == KIND_Q6K or kind == KIND_Q3K or kind == KIND_Q2K:
        xa, xb = _half_terms(xq, xd, xs, _int_bias(kind))  # [n, k/16] each
        return xq, xa, xb
    return interleave_blocks(xq), xd, _block_sums(xd, xs)  # [n, k], [n, k/32] x 2


@nb.njit(cache=True, nogil=True, inline="always")
def gemv_rows_per_task(m, tasks):
    """Rows per prange task of a gemv over m rows split into `tasks` (0: GEMV_ROWS each): even, so
    rows are always paired the same way (2r, 2r + 1)."""
    if tasks <= 0:
        return GEMV_ROWS
    per = (m + tasks - 1) // tasks
    return per + (per & 1)


@nb.njit(cache=True, nogil=True, inline="always")
def row_start(r, rb, sb_bytes, paired):
    """(byte offset of row r's first superblock, bytes between its superblocks) in rows of rb
    bytes, GGUF's layout or (paired) kquant_pairs' pair layout."""
    if paired:
        return (r - (r & 1)) * rb + (r & 1) * sb_bytes, 2 * sb_bytes
    return r * rb, sb_bytes


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def gemv_kquant(w, xq, xd, xs, y, kind, paired=0, tasks=0, pf=0, mode=0, threads=0):
    """y[n, m] = x @ W.T for every type (`kind`, a KIND_* constant, picks the row unpacker), meant
    for small n: per pair of rows, each superblock is unpacked once for up to GEMV_TOKENS tokens.
    paired: w's rows in kquant_pairs' pair layout (m even), else GGUF's. Knobs (matmul.py): tasks,
    the prange steps (0: GEMV_ROWS rows each); pf, rows_dot's prefetch distance in bytes; threads
    (kernel_threads); mode unused."""
    prev = fewer_threads(threads)
    m, rb = w.shape
    n, k = xq.shape
    x, xa, xb = gemv_operands(xq, xd, xs, kind)
    yo = y
    if n % GEMV_TOKENS == 3:  # a last group of 3 runs as 4 (its third token twice): cheaper than 2 + 1
        x, xa, xb = _dup_last(x), _dup_last(xa), _dup_last(xb)
        yo = np.empty((n + 1, m), np.float32)  # [n + 1, m]
    nx = x.shape[0]
    nf = xa.shape[1]
    nsb = k // QK_K
    sbb = rb // nsb  # bytes per superblock
    rpt = gemv_rows_per_task(m, tasks)
    for task in nb.prange((m + rpt - 1) // rpt):
        for r in range(task * rpt, min(m, (task + 1) * rpt), 2):
            r1 = min(r + 1, m - 1)  # an odd last row is computed twice into the same place
            off0, sbs = row_start(r, rb, sbb, paired)
            off1, _ = row_start(r1, rb, sbb, paired)
            t = 0
            while t < nx:
                nt = GEMV_TOKENS if nx - t >= GEMV_TOKENS else (2 if nx - t >= 2 else 1)
                rows_dot(kind, nt, w, off0, off1, x, t * k, k, xa, xb, t * nf, nf, nsb, yo, t * m + r, t * m + r1, m, pf,
                         sbs)
                t += nt
    if nx != n:
        y[:, :] = yo[:n]
    restore_threads(prev)


# ------------------------------------------------------------------------------- gemm


@nb.njit(cache=True, nogil=True, inline="always")
def _prepare_tile_block(xq, xd, xs, n0, tw, bias16, ib, xq4, xi4, xdt, xbt, xbi, tile, b):
    """Block b of tile `tile` (see _prepare_tiles): its tw tokens' groups, scales and sums."""
    n = xq.shape[0]
    nb_ = 2 if bias16 else 1
    for t in range(tw):
        tok = n0 + tile * tw + t
        if tok < n:
            for g in range(8):
                xi4[tile, (b * 8 + g) * tw + t] = xq4[tok, b * 8 + g]
            d = xd[tok, b]
            xdt[tile, b * tw + t] = d
            if bias16:
                lo = np.int32(0)
                for l in range(16):
                    lo = np.int32(lo + np.int32(xq[tok, 32 * b + l]))
                if ib > 0:
                    xbi[tile, 2 * b * tw + t] = np.int32(ib * lo)
                    xbi[tile, (2 * b + 1) * tw + t] = np.int32(ib * (xs[tok, b] - lo))
                else:
                    xbt[tile, 2 * b * tw + t] = d * np.float32(lo)
                    xbt[tile, (2 * b + 1) * tw + t] = d * np.float32(xs[tok, b] - lo)
            else:
                xbt[tile, b * tw + t] = d * np.float32(xs[tok, b])
        else:
            for g in range(8):
                xi4[tile, (b * 8 + g) * tw + t] = 0
            xdt[tile, b * tw + t] = 0.0
            for q in range(nb_):
                xbt[tile, (nb_ * b + q) * tw + t] = 0.0


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def _prepare_tiles_parallel(xq, xd, xs, n0, tw, bias16, ib, xq4, xi4, xdt, xbt, xbi):
    ntile, nblk = xi4.shape[0], xq.shape[1] // 32
    # one task per (tile, block), all tw tokens: a 64-byte line holds 16 tokens' words, so tasks
    # split by token would share every line between threads (much slower: docs/kernels.md)
    for it in nb.prange(ntile * nblk):
        _prepare_tile_block(xq, xd, xs, n0, tw, bias16, ib, xq4, xi4, xdt, xbt, xbi, it // nblk, it % nblk)


@nb.njit(cache=True, nogil=True, fastmath=False)
def _prepare_tiles(xq, xd, xs, n0, tw, bias16, ib, xi, xdt, xbt):
    """Tokens n0 : n0 + tw·ntile of (xq, xd, xs) as tw-token tiles (tw 16 or 8; missing tokens
    zero): xi int8 [ntile, k/32 · 32·tw] ([block][8 groups][tw tokens][4 bytes], as tile_dot
    reads it), xdt float32 [ntile, k/32 · tw] activation scales, and xbt float32 scale × sums: per
    block [tw] (block sums) or, with bias16, [2][tw] (sums of elements 0-15 and 16-31); with
    ib > 0 those two as int32 bits of ib × the sums (see tile_dot_s16_ib). Up to
    SERIAL_TILE_BYTES of tiles in the calling thread, more on the thread pool: the same bytes."""
    xq4 = xq.view(np.int32)  # [n, k/4] 4-byte groups: the interleave moves whole groups
    xi4 = xi.view(np.int32)  # [ntile, k/32 · 8·tw]
    xbi = xbt.view(np.int32)  # int bias terms (ib > 0)
    if xi.size > SERIAL_TILE_BYTES:
        _prepare_tiles_parallel(xq, xd, xs, n0, tw, bias16, ib, xq4, xi4, xdt, xbt, xbi)
        return
    nblk = xq.shape[1] // 32
    for it in range(xi.shape[0] * nblk):
        _prepare_tile_block(xq, xd, xs, n0, tw, bias16, ib, xq4, xi4, xdt, xbt, xbi, it // nblk, it % nblk)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def _gemm_rows(kind, paired, tw, w, n0, n_live, xi, xdt, xbt, y, tasks=0, pf=0):
    """y[n0 : n0 + n_live, :] for prepared tw-token tiles; `kind` picks the row decoder and tile
    dot at run time (one compiled kernel for every type; the branches are per row and per tile).
    paired: w in the pair layout. tasks: the prange steps, each a run of whole row groups (0:
    GEMM_TASKS_PER_THREAD a thread). pf: the first tile of a group prefetches its rows' bytes
    from pf past their start (0: GEMM_PREFETCH, -1: none)."""
    m, rb = w.shape
    ntile = xi.shape[0]
    nblk = xdt.shape[1] // tw
    k = nblk * 32
    nsb = k // QK_K
    sbb = rb // nsb
    s16 = kind == KIND_Q6K or kind == KIND_Q3K or kind == KIND_Q2K
    ns = 2 * nblk if s16 else nblk  # scales per row
    nc = 2 * nblk if s16 else nblk  # biases per row
    n_groups = (m + GEMM_ROWS - 1) // GEMM_ROWS
    n_tasks = min(n_groups, tasks if tasks > 0 else GEMM_TASKS_PER_THREAD * current_threads())
    ahead = GEMM_PREFETCH if pf == 0 else pf
    for task in nb.prange(n_tasks):
        u = empty_aligned(1, GEMM_ROWS * k, np.uint8)[0]  # [rows, k] decoded unsigned weights
        s = empty_aligned(1, GEMM_ROWS * ns, np.float32)[0]  # [rows, ns]
        c = empty_aligned(1, GEMM_ROWS * nc, np.float32)[0]  # [rows, nc]
        acc = empty_aligned(1, GEMM_ROWS * TOKENS, np.float32)[0]  # [rows, tw] rows × one tile
        for grp in range(task * n_groups // n_tasks, (task + 1) * n_groups // n_tasks):
            r0 = grp * GEMM_ROWS
            nr = min(m - r0, GEMM_ROWS)
            # rows past m in the last group run through tile_dot too (outputs dropped): zero them
            u[nr * k :] = 0
            s[nr * ns :] = 0.0
            c[nr * nc :] = 0.0
            for i in range(nr):
                off, sbs = row_start(r0 + i, rb, sbb, paired)
                decode_row(kind, w, off, nsb, u, i * k, s, i * ns, c, i * nc, sbs)
            for tile in range(ntile):
                live = min(tw, n_live - tile * tw)
                xdo = tile * nblk * tw
                xbo = 2 * xdo if s16 else xdo
                pfbytes = GEMM_ROWS * rb if tile == 0 and ahead > 0 else 0  # [r0, r0 + 4) are contiguous in both layouts
                tile_dot(kind, tw, u, 0, k, s, 0, ns, c, 0, nc, xi, 32 * xdo, xdt, xdo, xbt, xbo, nblk, acc, 0,
                         w, r0 * rb + ahead, pfbytes)
                if tw == TOKENS and nr == GEMM_ROWS:  # four floats a token
                    store_quad(acc, y, n0 + tile * tw, live, r0)
                else:
                    for i in range(nr):
                        for t in range(live):
                            y[n0 + tile * tw + t, r0 + i] = acc[i * tw + t]


@nb.njit(cache=True, nogil=True)
def _gemm(kind, paired, w, xq, xd, xs, y, tasks, pf):
    """Passes of up to _TILE_BYTES of tokens: tile the pass's activations, then all rows. A pass of
    at most 8 tokens uses 8-token tiles (ymm lanes: faster than a half-empty 16-token tile where ymm
    and zmm vpdpbusd issue at the same rate; docs/kernels.md)."""
    n, k = xq.shape
    nblk = k // 32
    bias16 = kind == KIND_Q6K or kind == KIND_Q3K or kind == KIND_Q2K
    nb_ = 2 if bias16 else 1
    per_pass = max(1, _TILE_BYTES // (TOKENS * k)) * TOKENS
    for n0 in range(0, n, per_pass):
        n_live = min(n - n0, per_pass)
        tw = 8 if n_live <= 8 else TOKENS
        ntile = (n_live + tw - 1) // tw
        xi = empty_aligned(ntile, nblk * 32 * tw, np.int8)  # [ntile, k/32 · 8 · tw · 4]
        xdt = empty_aligned(ntile, nblk * tw, np.float32)  # [ntile, k/32 · tw]
        xbt = empty_aligned(ntile, nb_ * nblk * tw, np.float32)  # [ntile, k/32 · (1|2) · tw]
        _prepare_tiles(xq, xd, xs, n0, tw, bias16, _int_bias(kind), xi, xdt, xbt)
        _gemm_rows(kind, paired, tw, w, n0, n_live, xi, xdt, xbt, y, tasks, pf)


@nb.njit(cache=True, nogil=True)
def gemm_kquant(w, xq, xd, xs, y, kind, paired=0, tasks=0, pf=0, mode=0, threads=0):
    """y[n, m] = x @ W.T tiled over 16 (or 8) tokens, for every type: `kind` (KIND_*) picks the
    row decoder; paired: w in the pair layout. One compiled kernel for all types (see
    typed_kernel). Knobs: tasks (the row loop's prange steps), pf (_gemm_rows' prefetch), threads
    (mode unused)."""
    prev = fewer_threads(threads)
    _gemm(kind, paired, w, xq, xd, xs, y, tasks, pf)
    restore_threads(prev)


# qtype -> its run-time kind (the kernels' bound argument; rows_dot's first argument)
KINDS = {T.Q2_K: KIND_Q2K, T.Q3_K: KIND_Q3K, T.Q4_K: KIND_Q4K, T.Q5_K: KIND_Q5K, T.Q6_K: KIND_Q6K, T.IQ4_XS: KIND_IQ4XS}
KERNELS = {qtype: (bind("gemv", qtype, gemv_kquant, kind, 0), bind("gemm", qtype, gemm_kquant, kind, 0))
           for qtype, kind in KINDS.items()}
# the kinds of rows in kquant_pairs' pair layout, whose Q4_K / Q5_K quants are repacked
PAIRED_KINDS = {**KINDS, T.Q4_K: KIND_Q4KP, T.Q5_K: KIND_Q5KP}
# the same kernels over rows in the pair layout (matmul.py picks them for a QTensor with
# grouped=True; the same bits as the raw rows')
PAIRED_KERNELS = {qtype: (bind("gemv", qtype, gemv_kquant, kind, 1), bind("gemm", qtype, gemm_kquant, kind, 1))
                  for qtype, kind in PAIRED_KINDS.items()}


def kind_of(w) -> int | None:
    """The run-time kind of K-quant QTensor w's rows as they are stored (None: not a K-quant)."""
    return (PAIRED_KINDS if w.grouped else KINDS).get(w.qtype)

# knobs the tuner may try beside tasks (backends/cpu/tuning.py): the gemv's prefetch distance in
# bytes; the gemm's (0 is GEMM_PREFETCH, -1 none)
KNOBS = {"gemv": {"prefetch": (1024, 4096)}, "gemm": {"prefetch": (-1, 4096)}}
