"""Thread layouts of the CUDA matmul kernels, and the output stores the integer (matmul_int.py) and
float (matmul_float.py) kernels share.

mat-vec (n <= MV_MAX_N): a warp per output row, MV_WARPS rows per thread block; each lane keeps a
partial sum per token, summed across the warp at the end.
tiled (n > MV_MAX_N): a thread block of TILE_THREADS per TILE_ROWS rows x TILE_TOKENS tokens; thread
tid owns row tid % TILE_ROWS and tokens tid // TILE_ROWS + TOK_STEP * q for q < OUT_PER_THREAD.
"""

from numba import cuda

from edged.backends.cuda.launch import fsum

MV_MAX_N = 8  # tokens at or below which the mat-vec kernel runs
MV_WARPS = 4  # rows (warps) per mat-vec thread block
MV_THREADS = 32 * MV_WARPS

TILE_ROWS = 16
TILE_TOKENS = 32
TILE_THREADS = 128
OUT_PER_THREAD = TILE_ROWS * TILE_TOKENS // TILE_THREADS  # 4
TOK_STEP = TILE_THREADS // TILE_ROWS  # 8


@cuda.jit(device=True, inline=True)
def store_matvec(y, acc, n, r, m, fscr, tid):
    """y[t, r] = this warp's lanes' acc[t] summed, for t < n (every lane must call; r >= m: none)."""
    for t in range(n):
        v = fsum(acc[t], 32, fscr, tid)
        if tid % 32 == 0 and r < m:
            y[t, r] = v


@cuda.jit(device=True, inline=True)
def store_tile(y, acc, t0, r0, tid):
    """y[t, r0 + row] = acc[q] for this thread's (row, token) outputs of the tile inside y."""
    n, m = y.shape
    row = tid % TILE_ROWS
    for q in range(OUT_PER_THREAD):
        t = t0 + tid // TILE_ROWS + TOK_STEP * q
        if t < n and r0 + row < m:
            y[t, r0 + row] = acc[q]
