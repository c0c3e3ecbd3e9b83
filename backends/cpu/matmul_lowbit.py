"""CPU matmul kernels for the low-bit types: IQ1_S, IQ1_M, TQ1_0, TQ2_0 and MXFP4.

Contract (backends/cpu/matmul.py): KERNELS[qtype] = (gemv, gemm), each
    f(w_rows uint8 [m, row_bytes], xq int8 [n, k], xd float32 [n, k/32], xs int32 [n, k/32],
      y float32 [n, m]) -> None.
They are the K-quant kernels' design (matmul_kquants.py) on lowbit_unpack's type table: weights
become unsigned bytes u with per-32 (IQ1_M: per-16) scales s and biases c, w = s·u + c, each block
dot u8 × i8 → int32 (vpdpbusd), and the per-32 bias term c · xd · xs uses the activations' block
sums (IQ1's ±1/8 delta and the ternary / MXFP4 offsets are all inside u and c):
- gemv (n <= matmul.GEMV_MAX_N): lowbit_rows.rows_dot per pair of rows and group of up to 4 tokens,
  each superblock unpacked once in registers for the group (MXFP4: a gather-free vpshufb of 8
  blocks' nibbles, like IQ4_XS).
- gemm: rows decoded once by lowbit_rows.decode_row, then kquant_gemm_tile.tile_dot per 4 rows ×
  16-token (or 8-token) tile: the same float operations in the same order as the gemv, so a
  token's output never depends on its batch.
MXFP4 rows may end inside a 256-element unit (gpt-oss: k = 2880 = 11.25 · 256): the activations
are zero-padded to whole units and the row's tail read from a zero-padded copy (lowbit_rows).
"""

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.aligned import empty_aligned
from edged.backends.cpu.kernel_threads import fewer_threads, restore_threads
from edged.backends.cpu.kquant_gemm_tile import TILE_ROWS, TOKENS, tile_dot
from edged.backends.cpu.kquant_gemv import GEMV_TOKENS, interleave_blocks
from edged.backends.cpu.kquant_unpack import KIND_Q4K, KIND_Q6K
from edged.backends.cpu.lowbit_rows import decode_row, rows_dot
from edged.backends.cpu.lowbit_unpack import IQ1M_BIAS, KIND_IQ1M, KIND_IQ1S, KIND_MXFP4, KIND_TQ1, KIND_TQ2, TYPES
from edged.backends.cpu.matmul_kquants import _block_sums, _dup_last, _half_terms, _prepare_tiles, gemv_rows_per_task
from edged.backends.cpu.typed_kernel import bind

QK_K = 256  # elements per superblock (MXFP4: per 8 blocks)
GEMV_ROWS = 16  # rows per prange task in the gemv
GEMM_ROWS = TILE_ROWS  # rows decoded together per gemm task and multiplied together per tile
_GEMM_TASKS = 16  # prange steps of the gemm row loop, each allocating its scratch once
_TILE_BYTES = 256 * 1024  # tokens per pass over the weights: one pass's tiles within ~256 KiB of L2
# tile_dot's body depends only on the family: Q4_K's kind selects "s32", Q6_K's "s16i"
_TILE_S32, _TILE_S16I = KIND_Q4K, KIND_Q6K
_SB_BYTES = np.array([TYPES[k][0] for k in range(len(TYPES))], np.int64)  # kind -> superblock bytes


@nb.njit(cache=True, nogil=True)
def _split_row(kind, rb):
    """(whole superblocks, tail bytes) of a row of rb bytes."""
    sb = _SB_BYTES[kind]
    nsb = rb // sb
    return nsb, rb - nsb * sb


@nb.njit(cache=True, nogil=True)
def _pad_units(xq, xd, xs, units):
    """(xq, xd, xs) zero-padded to `units` · 256 activations (themselves when already that long)."""
    n, k = xq.shape
    kp = units * QK_K
    if kp == k:
        return xq, xd, xs
    pq = np.zeros((n, kp), np.int8)  # [n, kp]
    pd = np.zeros((n, kp // 32), np.float32)  # [n, kp/32]
    ps = np.zeros((n, kp // 32), np.int32)  # [n, kp/32]
    pq[:, :k] = xq
    pd[:, : k // 32] = xd
    ps[:, : k // 32] = xs
    return pq, pd, ps


# ------------------------------------------------------------------------------- gemv


@nb.njit(cache=True, nogil=True, inline="always")
def gemv_operands(xq, xd, xs, kind, units):
    """rows_dot's activation operands of quantized x [n, k] for weights of `kind` whose rows span
    `units` superblocks (the last maybe partial): x zero-padded to units · 256 and, for IQ1_M,
    (xq, per-16 scales, bias terms [n, k/16]); for the others x in the rows dot's block layout
    and (scale, scale × block sum) [n, k/32]."""
    xq, xd, xs = _pad_units(xq, xd, xs, units)
    if kind == KIND_IQ1M:
        xa, xb = _half_terms(xq, xd, xs, IQ1M_BIAS)  # [n, k/16] each
        return xq, xa, xb
    return interleave_blocks(xq), xd, _block_sums(xd, xs)  # [n, k], [n, k/32] x 2


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def gemv_lowbit(w, xq, xd, xs, y, kind, tasks=0, pf=0, mode=0, threads=0):
    """y[n, m] = x @ W.T for every low-bit type (`kind`, a lowbit_unpack KIND_*), meant for small n:
    per pair of rows, each superblock is unpacked once for up to GEMV_TOKENS tokens. Knobs
    (matmul.py): tasks, the prange steps (0: GEMV_ROWS rows each); threads; pf and mode unused."""
    prev = fewer_threads(threads)
    m, rb = w.shape
    nsb, tail = _split_row(kind, rb)
    x, xa, xb = gemv_operands(xq, xd, xs, kind, nsb + (1 if tail else 0))
    n = xq.shape[0]
    k = x.shape[1]
    yo = y
    if n % GEMV_TOKENS == 3:  # a last group of 3 runs as 4 (its third token twice): cheaper than 2 + 1
        x, xa, xb = _dup_last(x), _dup_last(xa), _dup_last(xb)
        yo = np.empty((n + 1, m), np.float32)  # [n + 1, m]
    nx = x.shape[0]
    nf = xa.shape[1]
    rpt = GEMV_ROWS if tasks <= 0 else gemv_rows_per_task(m, tasks)  # even: rows paired alike
    for task in nb.prange((m + rpt - 1) // rpt):
        for r in range(task * rpt, min(m, (task + 1) * rpt), 2):
            r1 = min(r + 1, m - 1)  # an odd last row is computed twice into the same place
            t = 0
            while t < nx:
                nt = GEMV_TOKENS if nx - t >= GEMV_TOKENS else (2 if nx - t >= 2 else 1)
                rows_dot(kind, nt, w, r * rb, r1 * rb, x, t * k, k, xa, xb, t * nf, nf, nsb, tail, yo, t * m + r,
                         t * m + r1, m)
                t += nt
    if nx != n:
        y[:, :] = yo[:n]
    restore_threads(prev)


# ------------------------------------------------------------------------------- gemm


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def _gemm_rows(kind, tw, w, n0, n_live, xi, xdt, xbt, y, tasks=0):
    """y[n0 : n0 + n_live, :] for prepared tw-token tiles (matmul_kquants._gemm_rows with this
    module's row decoder), in `tasks` prange steps (0: _GEMM_TASKS)."""
    m, rb = w.shape
    nsb, tail = _split_row(kind, rb)
    ntile = xi.shape[0]
    nblk = xdt.shape[1] // tw
    k = nblk * 32
    s16 = kind == KIND_IQ1M
    ns = 2 * nblk if s16 else nblk  # scales (and biases) per row
    n_groups = (m + GEMM_ROWS - 1) // GEMM_ROWS
    n_tasks = min(n_groups, tasks if tasks > 0 else _GEMM_TASKS)
    for task in nb.prange(n_tasks):
        u = empty_aligned(1, GEMM_ROWS * k, np.uint8)[0]  # [rows, k] decoded unsigned weights
        s = empty_aligned(1, GEMM_ROWS * ns, np.float32)[0]  # [rows, ns]
        c = empty_aligned(1, GEMM_ROWS * ns, np.float32)[0]  # [rows, ns]
        acc = empty_aligned(1, GEMM_ROWS * TOKENS, np.float32)[0]  # [rows, tw] rows × one tile
        for grp in range(task * n_groups // n_tasks, (task + 1) * n_groups // n_tasks):
            r0 = grp * GEMM_ROWS
            nr = min(m - r0, GEMM_ROWS)
            # rows past m in the last group run through tile_dot too (outputs dropped): zero them
            u[nr * k :] = 0
            s[nr * ns :] = 0.0
            c[nr * ns :] = 0.0
            for i in range(nr):
                decode_row(kind, w, (r0 + i) * rb, nsb, tail, u, i * k, s, i * ns, c, i * ns)
            for tile in range(ntile):
                live = min(tw, n_live - tile * tw)
                xdo = tile * nblk * tw
                if s16:
                    tile_dot(_TILE_S16I, tw, u, 0, k, s, 0, ns, c, 0, ns, xi, 32 * xdo, xdt, xdo, xbt, 2 * xdo, nblk,
                             acc, 0, w, 0, 0)
                else:
                    tile_dot(_TILE_S32, tw, u, 0, k, s, 0, ns, c, 0, ns, xi, 32 * xdo, xdt, xdo, xbt, xdo, nblk, acc, 0,
                             w, 0, 0)
                for i in range(nr):
                    for t in range(live):
                        y[n0 + tile * tw + t, r0 + i] = acc[i * tw + t]


@nb.njit(cache=True, nogil=True)
def gemm_lowbit(w, xq, xd, xs, y, kind, tasks=0, pf=0, mode=0, threads=0):
    """y[n, m] = x @ W.T tiled over 16 (or 8) tokens for every low-bit type (`kind`): passes of up
    to _TILE_BYTES of tokens, each tiled once (matmul_kquants._prepare_tiles) then run over all rows
    (knobs: tasks, the row loop's; threads; pf and mode unused)."""
    prev = fewer_threads(threads)
    nsb, tail = _split_row(kind, w.shape[1])
    xq, xd, xs = _pad_units(xq, xd, xs, nsb + (1 if tail else 0))
    n, k = xq.shape
    nblk = k // 32
    bias16 = kind == KIND_IQ1M
    nb_ = 2 if bias16 else 1
    per_pass = max(1, _TILE_BYTES // (TOKENS * k)) * TOKENS
    for n0 in range(0, n, per_pass):
        n_live = min(n - n0, per_pass)
        tw = 8 if n_live <= 8 else TOKENS
        ntile = (n_live + tw - 1) // tw
        xi = empty_aligned(ntile, nblk * 32 * tw, np.int8)  # [ntile, k/32 · 8 · tw · 4]
        xdt = empty_aligned(ntile, nblk * tw, np.float32)  # [ntile, k/32 · tw]
        xbt = empty_aligned(ntile, nb_ * nblk * tw, np.float32)  # [ntile, k/32 · (1|2) · tw]
        _prepare_tiles(xq, xd, xs, n0, tw, bias16, IQ1M_BIAS if bias16 else 0, xi, xdt, xbt)
        _gemm_rows(kind, tw, w, n0, n_live, xi, xdt, xbt, y, tasks)
    restore_threads(prev)


# qtype -> lowbit_unpack kind
KINDS = {T.IQ1_S: KIND_IQ1S, T.IQ1_M: KIND_IQ1M, T.TQ1_0: KIND_TQ1, T.TQ2_0: KIND_TQ2, T.MXFP4: KIND_MXFP4}

KERNELS = {qtype: (bind("gemv", qtype, gemv_lowbit, kind), bind("gemm", qtype, gemm_lowbit, kind))
           for qtype, kind in KINDS.items()}
