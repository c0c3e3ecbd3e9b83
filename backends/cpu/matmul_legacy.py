"""Matmul kernels for the 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL.

Every kernel follows backends/cpu/matmul.py's q8_32 contract:
    f(w_rows uint8 [m, row_bytes], xq int8 [n, k], xd float32 [n, k/32], xs int32 [n, k/32],
      y float32 [n, m]) -> None
Each weight block becomes 32 *unsigned* bytes u and a per-block (scale d, bias c) with
    Σ_j w_j x_j = xd · (d · Σ_j u_j xq_j + c · xs)
(c = -B·d for the symmetric types and IQ4_NL, c = min for Q4_1/Q5_1), so the block dot is u8 × i8 with
int32 accumulation — the pattern LLVM lowers to vpdpbusd. For the symmetric types the kernels
subtract the integer B·xs from that dot instead of adding c·xs in float: xd · (d · (Σ u·xq - B·xs)).

gemv (n <= GEMV_MAX_N): per row, legacy_gemv.rows_dot8 decodes each group of 8 raw blocks once
for every token, transposes it in registers and sums 8 whole blocks per vpdpbusd lane against
activations repacked once per call (legacy_gemv.repack_groups8; a last group of <= 4 blocks, e.g.
k = 640, packs two tokens into each vector, so it costs half a group per token). At n = 1 a task's
grouped rows run in one loop with the lanes in registers (legacy_gemv.rows_dot8_one, the same bits).

gemm (n larger): activations are repacked once per call into 16-token tiles (4-interleaved int8,
per-block scales and sums), then legacy_gemm_tile's row tiles multiply each raw weight row (two
at a time when a pass has several tiles) by every tile — blocks decoded in registers, 8 vpdpbusd
per block giving 16 token lanes, no per-token horizontal sums.

Blocks (legacy_blocks.LAYOUTS): Q8_0 fp16 d, 32 int8 q, w = d·q (read as q ^ 0x80 = q + 128, fixed
by -128·Σx); Q4_0 fp16 d, 16 bytes of nibbles (low: elements 0-15, high: 16-31), w = d·(q - 8);
Q4_1 fp16 d, fp16 min m, nibbles, w = d·q + m; Q5_0 fp16 d, 4 bytes of fifth bits, nibbles,
w = d·(q - 16); Q5_1 fp16 d, fp16 m, fifth bits, nibbles, w = d·q + m; IQ4_NL fp16 d, nibbles
indexing a 16-value codebook, w = d·value (the lookup a vpshufb in the same in-register decoder).

Every kernel adds the per-block float terms in legacy_blocks' canonical 8-lane order, so a token's
output is bit-identical whichever kernel its batch size selects (batch invariance).
"""

from dataclasses import replace

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.aligned import empty_aligned
from edged.backends.cpu.kernel_threads import SERIAL_TILE_BYTES, current_threads, fewer_threads, restore_threads
from edged.backends.cpu.legacy_gemm_quad import FORM_DIRECT_Q8_0, GROUP_BYTES, ROWS, decode_row, decode_scales, quad_form, quad_tile_dot
from edged.backends.cpu.legacy_gemm_tile import GROUPS, TOKENS, row_tile_dot_raw8, rows2_tile_dot_raw8
from edged.backends.cpu.legacy_blocks import GROUPED_KINDS, INT_BIAS
from edged.backends.cpu.legacy_gemv import one_token_rows, repack_groups8, rows_dot8, rows_dot8_one
from edged.backends.cpu.legacy_groups import group_rows
from edged.backends.cpu.tile_store import store_quad
from edged.backends.cpu.typed_kernel import TypedKernel, bind
from edged.quant.tensor import QTensor

QK = 32

# block kinds (legacy_blocks.LAYOUTS keys)
KIND = {T.Q8_0: 0, T.Q4_0: 1, T.Q4_1: 2, T.Q5_0: 3, T.Q5_1: 4, T.IQ4_NL: 5}

# Up to this many tokens the gemv beats the 16-token-tile gemm (docs/kernels.md), so matmul.py
# picks gemv up to here for these types (bit-identical either way).
GEMV_MAX_N = 24


# ---------------------------------------------------------------- gemv: fused decode + block dot


# prange steps per call, each allocating its scratch once: smaller steps' allocations cost a
# small n = 1 call measurably (docs/kernels.md)
GEMV_TASKS = 32


@nb.njit(nogil=True, cache=True, inline="always")
def _gemv_raw(w, xq, xd, xs, y, kind, tasks, pf, mode):
    """Small-n matmul over raw blocks of LAYOUTS[kind] (`kind` a constant at each call site, so
    each kernel compiles its own row dot); parallel over rows, every token of a row at once.
    Run-time knobs (matmul.py; none changes a row's arithmetic): tasks, the prange steps (0:
    GEMV_TASKS); pf, mode: rows_dot8's prefetch distance and token grouping."""
    m = w.shape[0]
    n, k = xq.shape
    xt = empty_aligned((n + 1) // 2, ((k // QK + 7) // 8) * 512, np.int8)  # [token pairs, groups·512] 8-block groups, transposed
    repack_groups8(xq, xt)
    n_tasks = min(m, tasks if tasks > 0 else GEMV_TASKS)
    one = n == 1 and one_token_rows(kind, k // QK)  # one token: a task's rows in one loop
    for task in nb.prange(n_tasks):
        r0, r1 = task * m // n_tasks, (task + 1) * m // n_tasks
        if one:  # its lanes in registers: no scratch
            rows_dot8_one(w, kind, xt, xd, xs, y, r0, r1, pf)
        else:
            acc = empty_aligned(1, 8 * n, np.float32)[0]  # [n, 8] lane accumulators
            for r in range(r0, r1):
                rows_dot8(w[r], kind, xt, xq, xd, xs, acc, y, r, pf, mode)


def _make_gemv(qtype, grouped=False):
    """The gemv of one type, raw or grouped: its own compiled kernel, as rows_dot8 specializes on
    the layout (the closure's `kind` is a compile-time constant; Numba's cache keys on it). The
    knobs' defaults serve uncached test copies of py_func; the TypedKernel always passes them."""
    kind = KIND[qtype] + (GROUPED_KINDS if grouped else 0)

    def gemv(w, xq, xd, xs, y, tasks=0, pf=0, mode=0, threads=0):
        prev = fewer_threads(threads)
        _gemv_raw(w, xq, xd, xs, y, kind, tasks, pf, mode)
        restore_threads(prev)

    name = f"gemv_{qtype.name.lower()}" + ("_grouped" if grouped else "")
    gemv.__name__ = gemv.__qualname__ = name  # its name in the cache and in errors
    return TypedKernel(name, nb.njit(parallel=True, nogil=True, cache=True, fastmath=False)(gemv))


# ---------------------------------------------------------------- gemm: decoded rows × token tiles


@nb.njit(cache=True, nogil=True, inline="always")
def _int_bias(kind):
    """legacy_blocks.int_bias of a block kind (raw or grouped): > 0 for the symmetric types."""
    return INT_BIAS[kind % GROUPED_KINDS]


@nb.njit(cache=True, nogil=True, inline="always")
def _prepare_tile_block(xq4, xd, xs, n0, tile, b, xi4, xdt, xst, xsti, bias):
    """Block b of tile `tile` (see _prepare_tiles): 16 tokens' 8 four-byte groups, scales, sums."""
    n = xq4.shape[0]
    for t in range(TOKENS):
        tok = n0 + tile * TOKENS + t
        live = tok < n
        for g in range(GROUPS):
            xi4[tile, (b * GROUPS + g) * TOKENS + t] = xq4[tok, b * GROUPS + g] if live else np.int32(0)
        xdt[tile, b * TOKENS + t] = xd[tok, b] if live else np.float32(0.0)
        if bias > 0:
            xsti[tile, b * TOKENS + t] = np.int32(-bias * xs[tok, b]) if live else np.int32(0)
        else:
            xst[tile, b * TOKENS + t] = np.float32(xs[tok, b]) if live else np.float32(0.0)


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=False)
def _prepare_tiles_parallel(xq4, xd, xs, n0, ntile, xi4, xdt, xst, xsti, bias):
    nblk = xdt.shape[1] // TOKENS
    for tb in nb.prange(ntile * nblk):
        _prepare_tile_block(xq4, xd, xs, n0, tb // nblk, tb % nblk, xi4, xdt, xst, xsti, bias)


@nb.njit(nogil=True, cache=True, fastmath=False)
def _prepare_tiles(xq, xd, xs, n0, ntile, xi, xdt, xst, kind):
    """Tokens n0 : n0 + 16·ntile of (xq, xd, xs) -> 16-token tiles (missing tokens are zero):
    xi int8 [ntile, k/32 · 512] 4-interleaved, xdt / xst float32 [ntile, k/32 · 16]; xst holds
    float(xs), or for a symmetric kind (_int_bias B > 0) the int32 bits of -B·xs: the integer
    dots' start. Up to SERIAL_TILE_BYTES of tiles in the calling thread, more on the thread pool."""
    xq4 = xq.view(np.int32)  # [n, k/4] 4-byte groups: the interleave moves whole groups
    xi4 = xi.view(np.int32)  # [ntile, k/32 · 8 · 16]
    xsti = xst.view(np.int32)  # [ntile, k/32 · 16]
    bias = _int_bias(kind)
    if ntile * xi.shape[1] > SERIAL_TILE_BYTES:
        _prepare_tiles_parallel(xq4, xd, xs, n0, ntile, xi4, xdt, xst, xsti, bias)
        return
    nblk = xdt.shape[1] // TOKENS
    for tb in range(ntile * nblk):
        _prepare_tile_block(xq4, xd, xs, n0, tb // nblk, tb % nblk, xi4, xdt, xst, xsti, bias)


# prange steps per thread by default: each step allocates its scratch once (16-row steps spent
# ~2 ms of a 16-token Gemma output projection on that, docs/kernels.md); rows per step are whole
# runs of 16, so steps on two threads share no line of y
GEMM_TASKS_PER_THREAD = 8
# bytes past its rows that a quad prefetches when the knob is 0 (-1: none): without it the
# quads' reads from DRAM did not overlap their arithmetic (docs/kernels.md)
QUAD_PREFETCH = 4096


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=False)
def _gemm_rows(kind, w, n0, n_live, xi, xdt, xst, y, tasks=0, pf=0, mode=0):
    """y[n0 : n0 + n_live, :] for the prepared token tiles; each weight row is read once per pass,
    in at most `tasks` prange steps (0: GEMM_TASKS_PER_THREAD per thread); pf > 0 prefetches the
    weight bytes pf ahead (the quads: QUAD_PREFETCH at 0, none at -1). Rows are decoded once and
    run four at a time (legacy_gemm_quad; their results go to y directly), except with mode 1 for
    a single tile, which decodes inside the tile (legacy_gemm_tile). A single tile of grouped Q8_0
    rows reads the quads' words in place (legacy_gemm_quad.direct_q8_0: ~0.9x the time of decoding
    them, docs/kernels.md). The same bits every way."""
    m = w.shape[0]
    ntile = xi.shape[0]
    nblk = xdt.shape[1] // TOKENS
    ngroup = (nblk + GROUPS - 1) // GROUPS
    ustride, sstride = ngroup * GROUP_BYTES, ngroup * GROUPS  # one decoded row's words / scales
    steps = tasks if tasks > 0 else GEMM_TASKS_PER_THREAD * current_threads()
    rpt = TOKENS * max(1, (m + TOKENS * steps - 1) // (TOKENS * steps))  # rows per step
    qpf = QUAD_PREFETCH if pf == 0 else max(pf, 0)
    form = quad_form(kind, nblk, ntile)
    for task in nb.prange((m + rpt - 1) // rpt):
        acc = np.empty(ROWS * TOKENS, np.float32)  # [4 rows, 16 tokens]
        r0 = task * rpt
        nr = min(m - r0, rpt)
        quads = nr - nr % ROWS if mode == 0 or ntile > 1 else 0
        yt = np.empty((n_live, nr - quads), np.float32)  # [n_live, rows after the quads]: transposed writes stay local
        if quads:
            u = np.empty(ROWS * ustride, np.uint8)  # [4 rows, groups, 8 words, 8 blocks, 4 bytes]
            ds = np.empty(ROWS * sstride, np.float32)  # [4 rows, groups · 8]
            cs = np.empty(ROWS * sstride, np.float32)
            for i in range(0, quads, ROWS):
                for q in range(ROWS):
                    if form == FORM_DIRECT_Q8_0:  # the rows are read in place: their scales alone
                        decode_scales(w[r0 + i + q], ds, q * sstride)
                    else:
                        decode_row(w[r0 + i + q], kind, u, q * ustride, ds, cs, q * sstride)
                for tile in range(ntile):
                    quad_tile_dot(u, ustride, ds, cs, sstride, xi[tile], xdt[tile], xst[tile], acc, nblk,
                                  w, r0 + i, qpf if tile == 0 else 0, form)
                    store_quad(acc, y, n0 + tile * TOKENS, min(TOKENS, n_live - tile * TOKENS), r0 + i)
        # the rest: row pairs share each tile block's activation loads; a single tile reading its
        # rows from DRAM ran ~1.2x slower in pairs (docs/kernels.md), so it keeps one
        paired = quads + ((nr - quads) - (nr - quads) % 2 if ntile > 1 else 0)  # rows done in pairs
        for i in range(quads, paired, 2):
            for tile in range(ntile):
                rows2_tile_dot_raw8(w[r0 + i], w[r0 + i + 1], kind, xi[tile], xdt[tile], xst[tile], acc,
                                    pf if tile == 0 else 0)
                for t in range(min(TOKENS, n_live - tile * TOKENS)):
                    yt[tile * TOKENS + t, i - quads] = acc[t]
                    yt[tile * TOKENS + t, i + 1 - quads] = acc[TOKENS + t]
        for i in range(paired, nr):
            for tile in range(ntile):
                row_tile_dot_raw8(w[r0 + i], kind, xi[tile], xdt[tile], xst[tile], acc)  # run-time kind: a switch
                for t in range(min(TOKENS, n_live - tile * TOKENS)):
                    yt[tile * TOKENS + t, i - quads] = acc[t]
        for t in range(n_live):
            for i in range(quads, nr):
                y[n0 + t, r0 + i] = yt[t, i - quads]


# tokens per pass over the weights: keeps one pass's tiles (tokens · k bytes) within ~512 KiB of L2
_TILE_BYTES = 512 * 1024


@nb.njit(nogil=True, cache=True)
def _gemm(kind, w, xq, xd, xs, y, tasks, pf, mode):
    n, k = xq.shape
    nblk = k // QK
    tiles_per_pass = max(1, _TILE_BYTES // (TOKENS * k))
    for n0 in range(0, n, tiles_per_pass * TOKENS):
        n_live = min(n - n0, tiles_per_pass * TOKENS)
        ntile = (n_live + TOKENS - 1) // TOKENS
        xi = empty_aligned(ntile, nblk * 512, np.int8)  # [ntile, k/32 * 8 * 16 * 4]
        xdt = empty_aligned(ntile, nblk * TOKENS, np.float32)  # [ntile, k/32 * 16]
        xst = empty_aligned(ntile, nblk * TOKENS, np.float32)  # [ntile, k/32 * 16]
        _prepare_tiles(xq, xd, xs, n0, ntile, xi, xdt, xst, kind)
        _gemm_rows(kind, w, n0, n_live, xi, xdt, xst, y, tasks, pf, mode)


@nb.njit(nogil=True, cache=True)
def gemm_legacy(w, xq, xd, xs, y, kind, tasks=0, pf=0, mode=0, threads=0):
    """The 16-token-tile gemm of every legacy type (`kind` a KIND value, run-time: one compiled
    kernel for all six); knobs: tasks (the row loop's prange steps), pf (bytes prefetched ahead
    of the weight reads), mode (1: a single tile decodes its rows inside the tile), threads."""
    prev = fewer_threads(threads)
    _gemm(kind, w, xq, xd, xs, y, tasks, pf, mode)
    restore_threads(prev)


KERNELS = {qtype: (_make_gemv(qtype), bind("gemm", qtype, gemm_legacy, np.int64(kind))) for qtype, kind in KIND.items()}

# the same types' kernels over rows in legacy_groups' grouped layout (matmul.py picks them for a
# QTensor with grouped=True; the same bits as the raw rows')
GROUPED_KERNELS = {
    qtype: (_make_gemv(qtype, grouped=True),
            TypedKernel(f"gemm_{qtype.name.lower()}_grouped", gemm_legacy, np.int64(GROUPED_KINDS + kind)))
    for qtype, kind in KIND.items()
}


def grouped(w: QTensor) -> QTensor:
    """A 2-D legacy-type weight with its rows regrouped (legacy_groups.py): a copy in memory."""
    return replace(w, data=group_rows(w.rows(), KIND[w.qtype]).reshape(-1), grouped=True)

# knobs the tuner may try beside tasks (backends/cpu/tuning.py): prefetch bytes (the gemm quads: -1 none, 0 their
# QUAD_PREFETCH), mode 1 = one token a dot
KNOBS = {"gemv": {"prefetch": (1024, 4096), "mode": (1,)}, "gemm": {"prefetch": (-1, 1024), "mode": (1,)}}
