"""CPU matmul kernels for the grid-codebook i-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S.

Contract (backends/cpu/matmul.py): KERNELS[qtype] = (gemv, gemm), each
    f(w_rows uint8 [m, row_bytes], xq int8 [n, k], xd float32 [n, k/32], xs int32 [n, k/32],
      y float32 [n, m]) -> None.
A weight is w_e = s · sign_e · g_e: g a level of the type's grid row (quant/iq_grids.py: 8 or 4
magnitudes per index), sign_e from a sign byte (IQ2_XXS / IQ2_XS / IQ3_XXS: KSIGNS_IQ2XS of a
7-bit index), s the fp16 d times a 4-bit sub-scale (per 32 elements; IQ2_XS / IQ2_S per 16).
Those products are exact in float32, so decoding to unsigned bytes u_e = sign_e · g_e + B (B the
type's largest level, _BIAS) with c = -B · s gives w_e = s · u_e + c exactly: the K-quant form,
and the block dot Σ w_e x_e = xd · (s · Σ u·xq + c · Σ xq) is u8 × i8 → int32 (vpdpbusd).

- gemm (n > matmul.GEMV_MAX_N): each row group is decoded once per pass by _decode_superblock
  into (u, s, c), then kquant_gemm_tile.tile_dot multiplies it by every 16- (or 8-) token tile
  prepared by matmul_kquants' _prepare_tiles: per-32 types as tile family "s32", IQ2_XS / IQ2_S
  as "s16" (per-16 scales and biases).
- gemv (small n): parallel over row tasks; each superblock of a row is decoded once into scratch
  and dotted with every token in plain Numba, with the tile's float operations in its order
  (block term, then the superblock tree ((t0+t1)+(t2+t3))+((t4+t5)+(t6+t7)), superblocks added
  from +0.0), so a token's output never depends on its batch (batch invariance).
Both are one compiled kernel for all five types (a run-time `kind`), bound per type by
typed_kernel.bind.
"""

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.aligned import empty_aligned
from edged.backends.cpu.kernel_threads import fewer_threads, restore_threads
from edged.backends.cpu.kquant_gemm_tile import TILE_ROWS, TOKENS, tile_dot
from edged.backends.cpu.kquant_unpack import KIND_Q2K, KIND_Q4K
from edged.backends.cpu.matmul_kquants import _block_sums, _half_terms, _prepare_tiles
from edged.backends.cpu.typed_kernel import bind
from edged.quant.f16 import f16_at
from edged.quant.iq_grids import (
    IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3_S_BYTES, IQ3_XXS_BYTES,
    IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, QK_K,
)

KIND_IQ2XXS, KIND_IQ2XS, KIND_IQ2S, KIND_IQ3XXS, KIND_IQ3S = 0, 1, 2, 3, 4
_KINDS = {T.IQ2_XXS: KIND_IQ2XXS, T.IQ2_XS: KIND_IQ2XS, T.IQ2_S: KIND_IQ2S, T.IQ3_XXS: KIND_IQ3XXS,
          T.IQ3_S: KIND_IQ3S}
# per kind: bytes per superblock, and B = the largest grid level (u = ±g + B stays in 0..2B <= 124)
_BBYTES = np.array([IQ2_XXS_BYTES, IQ2_XS_BYTES, IQ2_S_BYTES, IQ3_XXS_BYTES, IQ3_S_BYTES], np.int64)
_BIAS = np.array([int(g.max()) for g in (IQ2XXS_GRID, IQ2XS_GRID, IQ2S_GRID, IQ3XXS_GRID, IQ3S_GRID)], np.int64)
# tile_dot picks its block-term family from a K-quant kind: Q4_K's is "s32", Q2_K's "s16"
_TILE_S32, _TILE_S16 = KIND_Q4K, KIND_Q2K

_GEMV_TASKS = 32  # prange steps of the gemv, each allocating its scratch once (as matmul_legacy)
GEMM_ROWS = TILE_ROWS  # rows decoded together per gemm group and multiplied together per tile
_GEMM_TASKS = 16  # prange steps of the gemm row loop (not yet measured per thread, as matmul_kquants' are)
_TILE_BYTES = 256 * 1024  # tokens per pass: one pass's tiles (tokens · k bytes) within ~256 KiB of L2


@nb.njit(cache=True, nogil=True, inline="always")
def _per16(kind):
    """IQ2_XS and IQ2_S carry a sub-scale per 16 elements; the others one per 32."""
    return kind == KIND_IQ2XS or kind == KIND_IQ2S


@nb.njit(cache=True, nogil=True, inline="always")
def _u32_at(row, o):
    """Little-endian uint32 at byte o of a uint8 row."""
    return (np.uint32(row[o]) | (np.uint32(row[o + 1]) << np.uint32(8)) | (np.uint32(row[o + 2]) << np.uint32(16))
            | (np.uint32(row[o + 3]) << np.uint32(24)))


@nb.njit(cache=True, nogil=True, inline="always")
def _put_signed(u, uo, grid, gi, signs, shift, bias):
    """u[uo : uo + width] = bias ± grid[gi] (minus where bit shift + l of `signs` is set)."""
    for l in range(grid.shape[1]):
        g = np.int32(grid[gi, l])
        u[uo + l] = np.uint8(bias - g if (signs >> (shift + l)) & 1 else bias + g)


@nb.njit(cache=True, nogil=True)
def _decode_superblock(kind, row, o, u, uo, s, so, c, co):
    """One superblock of type `kind` at byte o of `row` -> u uint8 [256] from uo, and float32
    scales s / biases c with w_e = s · u_e + c: [8] per-32 or [8][2] per-16 (IQ2_XS, IQ2_S) from
    so / co. The byte layouts are quant/iq_grids.py's (llama.cpp's block_iq*)."""
    bias = np.int32(_BIAS[kind])
    nb_ = np.float32(-_BIAS[kind])
    d = f16_at(row, o)
    ks = KSIGNS_IQ2XS
    if kind == KIND_IQ2XXS:  # d | 8 × (4 grid bytes, u32: 4 × 7-bit sign index, 4-bit scale)
        for ib in range(8):
            q = o + 2 + 8 * ib
            aux = _u32_at(row, q + 4)
            db = d * (np.float32(0.5) + np.float32(aux >> np.uint32(28))) * np.float32(0.25)
            s[so + ib] = db
            c[co + ib] = nb_ * db
            for l in range(4):
                sg = np.int32(ks[(aux >> np.uint32(7 * l)) & np.uint32(127)])
                _put_signed(u, uo + 32 * ib + 8 * l, IQ2XXS_GRID, row[q + l], sg, 0, bias)
    elif kind == KIND_IQ2XS or kind == KIND_IQ2S:
        sc = o + (66 if kind == KIND_IQ2XS else 74)  # 4-bit scales: low nibble elements 0-15, high 16-31
        for ib in range(8):
            for h in range(2):
                db = d * (np.float32(0.5) + np.float32((row[sc + ib] >> (4 * h)) & 15)) * np.float32(0.25)
                s[so + 2 * ib + h] = db
                c[co + 2 * ib + h] = nb_ * db
            for l in range(4):
                i = 4 * ib + l
                if kind == KIND_IQ2XS:  # d | 32 × u16 (9-bit grid index, 7-bit sign index) | scales 8
                    v = np.int32(row[o + 2 + 2 * i]) | (np.int32(row[o + 3 + 2 * i]) << 8)
                    _put_signed(u, uo + 8 * i, IQ2XS_GRID, v & 511, np.int32(ks[v >> 9]), 0, bias)
                else:  # d | qs 32 | signs 32 | qh 8 (2 high index bits each) | scales 8
                    gi = np.int32(row[o + 2 + i]) | ((np.int32(row[o + 66 + ib]) >> (2 * l)) & 3) << 8
                    _put_signed(u, uo + 8 * i, IQ2S_GRID, gi, np.int32(row[o + 34 + i]), 0, bias)
    elif kind == KIND_IQ3XXS:  # d | qs 64 grid bytes | 8 × u32 (4 × 7-bit sign index, 4-bit scale)
        for ib in range(8):
            aux = _u32_at(row, o + 66 + 4 * ib)
            db = d * (np.float32(0.5) + np.float32(aux >> np.uint32(28))) * np.float32(0.5)
            s[so + ib] = db
            c[co + ib] = nb_ * db
            for l in range(4):
                sg = np.int32(ks[(aux >> np.uint32(7 * l)) & np.uint32(127)])
                for e in range(2):
                    _put_signed(u, uo + 32 * ib + 8 * l + 4 * e, IQ3XXS_GRID, row[o + 2 + 8 * ib + 2 * l + e], sg,
                                4 * e, bias)
    else:  # IQ3_S: d | qs 64 | qh 8 (9th index bit each) | signs 32 | scales 4 (nibbles)
        for ib in range(8):
            db = d * np.float32(1 + 2 * ((np.int32(row[o + 106 + ib // 2]) >> (4 * (ib % 2))) & 15))
            s[so + ib] = db
            c[co + ib] = nb_ * db
            for j in range(8):
                i = 8 * ib + j
                gi = np.int32(row[o + 2 + i]) | ((np.int32(row[o + 66 + ib]) >> j) & 1) << 8
                _put_signed(u, uo + 4 * i, IQ3S_GRID, gi, np.int32(row[o + 74 + i // 2]), 4 * (j % 2), bias)


# ------------------------------------------------------------------------------- gemv


@nb.njit(cache=True, nogil=True, inline="always")
def _dot16(u, uo, xq, t, xo):
    """Exact int32 Σ u·xq over 16 elements."""
    acc = np.int32(0)
    for l in range(16):
        acc = np.int32(acc + np.int32(u[uo + l]) * np.int32(xq[t, xo + l]))
    return acc


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def gemv_iqgrid(w, xq, xd, xs, y, kind, tasks=0, pf=0, mode=0, threads=0):
    """y[n, m] = x @ W.T for small n: per row, each superblock decoded once for every token; the
    block terms are tile_dot's (s32: S·(xd·s) + c·(xd·xs); s16: per 16-half, summed as the tile).
    Knobs (matmul.py): tasks, the prange steps (0: _GEMV_TASKS); threads; pf and mode unused."""
    prev = fewer_threads(threads)
    m = w.shape[0]
    n, k = xq.shape
    nsb = k // QK_K
    bb = _BBYTES[kind]
    per16 = _per16(kind)
    if per16:
        xa, xb = _half_terms(xq, xd, xs, 0)  # [n, k/16] each: xd twice, xd · half sums
    else:
        xa, xb = xd, _block_sums(xd, xs)  # [n, k/32] each
    n_tasks = min(m, tasks if tasks > 0 else _GEMV_TASKS)
    for task in nb.prange(n_tasks):
        u = np.empty(QK_K, np.uint8)  # [256] one decoded superblock
        s = np.empty(16, np.float32)  # [8] or [8][2]
        c = np.empty(16, np.float32)
        acc = np.empty(n, np.float32)  # [n] per-token running sums
        tw = np.empty(8, np.float32)  # [8] one superblock's block terms
        for r in range(task * m // n_tasks, (task + 1) * m // n_tasks):
            row = w[r]
            acc[:] = 0.0
            for sb in range(nsb):
                _decode_superblock(kind, row, sb * bb, u, 0, s, 0, c, 0)
                for t in range(n):
                    for j in range(8):
                        b = sb * 8 + j
                        lo = _dot16(u, 32 * j, xq, t, 32 * b)
                        hi = _dot16(u, 32 * j + 16, xq, t, 32 * b + 16)
                        if per16:
                            d = xa[t, 2 * b]
                            v = np.float32(lo) * (d * s[2 * j]) + np.float32(hi) * (d * s[2 * j + 1])
                            tw[j] = v + (c[2 * j] * xb[t, 2 * b] + c[2 * j + 1] * xb[t, 2 * b + 1])
                        else:
                            tw[j] = np.float32(np.int32(lo + hi)) * (xa[t, b] * s[j]) + c[j] * xb[t, b]
                    acc[t] += ((tw[0] + tw[1]) + (tw[2] + tw[3])) + ((tw[4] + tw[5]) + (tw[6] + tw[7]))
            for t in range(n):
                y[t, r] = acc[t]
    restore_threads(prev)


# ------------------------------------------------------------------------------- gemm


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def _gemm_rows(kind, tw, w, n0, n_live, xi, xdt, xbt, y, tasks=0):
    """y[n0 : n0 + n_live, :] for prepared tw-token tiles: GEMM_ROWS rows decoded once per pass,
    then multiplied by every tile (tile_dot), in `tasks` prange steps (0: _GEMM_TASKS)."""
    m = w.shape[0]
    ntile = xi.shape[0]
    nblk = xdt.shape[1] // tw
    k = nblk * 32
    nsb = k // QK_K
    bb = _BBYTES[kind]
    per16 = _per16(kind)
    fam = _TILE_S16 if per16 else _TILE_S32
    ns = 2 * nblk if per16 else nblk  # scales (and biases) per row
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
                row = w[r0 + i]
                for sb in range(nsb):
                    o16 = i * ns + sb * (16 if per16 else 8)
                    _decode_superblock(kind, row, sb * bb, u, i * k + sb * QK_K, s, o16, c, o16)
            for tile in range(ntile):
                live = min(tw, n_live - tile * tw)
                xdo = tile * nblk * tw
                xbo = 2 * xdo if per16 else xdo
                tile_dot(fam, tw, u, 0, k, s, 0, ns, c, 0, ns, xi, 32 * xdo, xdt, xdo, xbt, xbo, nblk, acc, 0, w, 0, 0)
                for i in range(nr):
                    for t in range(live):
                        y[n0 + tile * tw + t, r0 + i] = acc[i * tw + t]


@nb.njit(cache=True, nogil=True)
def gemm_iqgrid(w, xq, xd, xs, y, kind, tasks=0, pf=0, mode=0, threads=0):
    """y[n, m] = x @ W.T in passes of up to _TILE_BYTES of tokens, 16-token tiles (8 when a pass
    has at most 8 tokens, as matmul_kquants); knobs: tasks (the row loop's), threads (pf, mode
    unused)."""
    prev = fewer_threads(threads)
    n, k = xq.shape
    nblk = k // 32
    per16 = _per16(kind)
    nb_ = 2 if per16 else 1
    per_pass = max(1, _TILE_BYTES // (TOKENS * k)) * TOKENS
    for n0 in range(0, n, per_pass):
        n_live = min(n - n0, per_pass)
        tw = 8 if n_live <= 8 else TOKENS
        ntile = (n_live + tw - 1) // tw
        xi = empty_aligned(ntile, nblk * 32 * tw, np.int8)  # [ntile, k/32 · 8 · tw · 4]
        xdt = empty_aligned(ntile, nblk * tw, np.float32)  # [ntile, k/32 · tw]
        xbt = empty_aligned(ntile, nb_ * nblk * tw, np.float32)  # [ntile, k/32 · (1|2) · tw]
        _prepare_tiles(xq, xd, xs, n0, tw, per16, 0, xi, xdt, xbt)
        _gemm_rows(kind, tw, w, n0, n_live, xi, xdt, xbt, y, tasks)
    restore_threads(prev)


KERNELS = {qtype: (bind("gemv", qtype, gemv_iqgrid, kind), bind("gemm", qtype, gemm_iqgrid, kind))
           for qtype, kind in _KINDS.items()}
