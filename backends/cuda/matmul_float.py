"""Matmul kernels for float weights (F32, F16, BF16) with float32 activations and accumulation.

The weight rows arrive as a typed view of the raw bytes (float32 [m, k] or the uint16 bit
patterns [m, k]); `value(w, r, j)` widens one element exactly. Same two shapes as matmul_int
(matmul_layout.py): a warp per row with lanes striding the row (coalesced) for n <= MV_MAX_N, and
shared-memory tiles of TILE_ROWS rows × TILE_TOKENS tokens over 32-element stages for larger n.
"""

from numba import cuda, float32, int32

from edged.backends.cuda.dequant import bf16_from_bits, f16_from_bits
from edged.backends.cuda.matmul_layout import (
    MV_MAX_N, MV_THREADS, MV_WARPS, OUT_PER_THREAD, TILE_ROWS, TILE_THREADS, TILE_TOKENS, TOK_STEP,
    store_matvec, store_tile,
)

_KC = 32  # elements per tiled stage
_KCP = _KC + 1  # padded row stride: a warp's 16 rows fall in different banks
_W_PER = TILE_ROWS * _KC // TILE_THREADS
_X_PER = TILE_TOKENS * _KC // TILE_THREADS


@cuda.jit(device=True, inline=True)
def f32_value(w, r, j):
    return w[r, j]


@cuda.jit(device=True, inline=True)
def f16_value(w, r, j):
    return f16_from_bits(int32(w[r, j]))


@cuda.jit(device=True, inline=True)
def bf16_value(w, r, j):
    return bf16_from_bits(int32(w[r, j]))


def make_float_kernels(value):
    """(matvec, tiled) kernels f(w [m, k] typed view, x float32 [n, k], y float32 [n, m])."""

    @cuda.jit
    def matvec(w, x, y):
        fscr = cuda.shared.array(MV_THREADS, float32)  # reduction scratch (simulator only)
        acc = cuda.local.array(MV_MAX_N, float32)
        tid = cuda.threadIdx.x
        lane = tid % 32
        m, k = w.shape
        n = x.shape[0]
        r = cuda.blockIdx.x * MV_WARPS + tid // 32
        rr = min(r, m - 1)
        for t in range(n):
            acc[t] = float32(0.0)
        for j in range(lane, k, 32):
            v = value(w, rr, j)
            for t in range(n):
                acc[t] += v * x[t, j]
        store_matvec(y, acc, n, r, m, fscr, tid)

    @cuda.jit
    def tiled(w, x, y):
        sw = cuda.shared.array((TILE_ROWS, _KCP), float32)
        sx = cuda.shared.array((TILE_TOKENS, _KCP), float32)
        acc = cuda.local.array(OUT_PER_THREAD, float32)
        tid = cuda.threadIdx.x
        m, k = w.shape
        n = x.shape[0]
        r0 = cuda.blockIdx.x * TILE_ROWS
        t0 = cuda.blockIdx.y * TILE_TOKENS
        row = tid % TILE_ROWS
        for q in range(OUT_PER_THREAD):
            acc[q] = float32(0.0)
        for k0 in range(0, k, _KC):
            for q in range(_W_PER):
                e = tid + TILE_THREADS * q
                i = e // _KC
                j = e % _KC
                ok = k0 + j < k
                sw[i, j] = value(w, min(r0 + i, m - 1), k0 + j) if ok else float32(0.0)
            for q in range(_X_PER):
                e = tid + TILE_THREADS * q
                i = e // _KC
                j = e % _KC
                sx[i, j] = x[min(t0 + i, n - 1), k0 + j] if k0 + j < k else float32(0.0)
            cuda.syncthreads()
            for j in range(_KC):  # each weight serves the thread's tokens
                wv = sw[row, j]
                for q in range(OUT_PER_THREAD):
                    acc[q] += wv * sx[tid // TILE_ROWS + TOK_STEP * q, j]
            cuda.syncthreads()
        store_tile(y, acc, t0, r0, tid)

    return matvec, tiled
