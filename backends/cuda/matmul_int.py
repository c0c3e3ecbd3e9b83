"""Integer matmul kernels for every block type (Q4_0 .. Q8_0, IQ4_NL, K-quants, IQ4_XS).

Weights decode through dequant.py's (load4, scales) as w = s·u + c; activations arrive quantized
by act_quant.py (int8 per 32 with scale xd and int32 sum xs, as on the CPU). Each block dot is
exact int32 and turns into float with a per-block formula for the type's family:

    LEGACY (32-blocks, (d, c)):  xd · (d · S + c · xs)                  (cpu/legacy_blocks.py)
    K32 (per-32 scale, bias):    S · (xd · s) + c · (xd · xs)           (cpu/kquant_gemm_tile.py "s32")
    K16 (per-16):                (lo · (xd · s0) + hi · (xd · s1)) + (c0 · (xd · X0) + c1 · (xd · X1))
                                 with lo / hi and X0 / X1 the dots and activation sums of each half.

K32 and Q2_K's K16 are the CPU kernels' formulas, and LEGACY is theirs for Q4_1 / Q5_1; for the
symmetric legacy types (Q4_0, Q5_0, Q8_0, IQ4_NL), Q3_K and Q6_K the CPU folds c into the integer
dot (legacy_blocks.int_bias, "s16i"), which rounds differently. Otherwise the order in which block terms are
summed (and the device's fused multiply-adds) differ from the CPU.

Thread layouts are in matmul_layout.py. mat-vec (n <= MV_MAX_N): one warp per output row; 8 lanes
share a 32-block (4 consecutive weights each, so a warp reads 4 blocks' bytes together), decode
them once into registers and dot them with every token; the lanes' int32 partial dots are summed
exactly within the block (or half-block) by shuffles, the float terms per token across the warp.
tiled (n > MV_MAX_N): a thread block per TILE_ROWS rows × TILE_TOKENS tokens; each stage of
STAGE_BLOCKS 32-blocks is decoded once into shared memory (weights u8, activations i8, scales) and
used by every (row, token) of the tile.
"""

from numba import cuda, float32, int32, int8, uint8

from edged.backends.cuda.dequant import K16, LEGACY
from edged.backends.cuda.launch import isum
from edged.backends.cuda.matmul_layout import (
    MV_MAX_N, MV_THREADS, MV_WARPS, OUT_PER_THREAD, TILE_ROWS, TILE_THREADS, TILE_TOKENS, TOK_STEP,
    store_matvec, store_tile,
)

STAGE_BLOCKS = 4  # 32-blocks decoded into shared memory per stage
_W_GROUPS = TILE_ROWS * 8 * STAGE_BLOCKS // TILE_THREADS  # 4-byte weight groups per thread per stage
_X_GROUPS = TILE_TOKENS * 8 * STAGE_BLOCKS // TILE_THREADS  # 4-byte activation groups per thread per stage
_SE = 32 * STAGE_BLOCKS  # elements per stage
_SEP = _SE + 4  # padded row stride: rows of a warp's reads fall in different banks
_SH = 2 * STAGE_BLOCKS  # half-blocks per stage (shared-array shapes need plain constants)


@cuda.jit(device=True, inline=True)
def _legacy_term(S, X, dx, s, c):
    """A LEGACY block's float term from its int32 dot S and activation sum X: dx (s S + c X)."""
    return dx * (s * float32(S) + c * float32(X))


@cuda.jit(device=True, inline=True)
def _kquant_term(S, X, dx, s, c):
    """A K32 block's (or one K16 half-block's) float term: S (dx s) + c (dx X)."""
    return float32(S) * (dx * s) + c * (dx * float32(X))


@cuda.jit(device=True, inline=True)
def _k16_term(lo, hi, X0, X1, dx, s0, s1, c0, c1):
    """A K16 block's float term from its two halves, summed in the CPU kernel's order."""
    scaled = float32(lo) * (dx * s0) + float32(hi) * (dx * s1)
    return scaled + (c0 * (dx * float32(X0)) + c1 * (dx * float32(X1)))


def make_int_kernels(load4, scales, family):
    """(matvec, tiled) kernels for one block type, both f(w uint8 [m, rb], xq int8 [n, k],
    xd float32 [n, k/32], xs int32 [n, k/32], y float32 [n, m]); `family` is a compile-time constant."""
    return _make_matvec(load4, scales, family), _make_tiled(load4, scales, family)


def _make_matvec(load4, scales, family):
    gw = 4 if family == K16 else 8  # lanes per exact int32 group: a half-block or a block
    term = _legacy_term if family == LEGACY else _kquant_term

    @cuda.jit
    def matvec(w, xq, xd, xs, y):
        iscr = cuda.shared.array(MV_THREADS, int32)  # reduction scratch (simulator only)
        fscr = cuda.shared.array(MV_THREADS, float32)
        acc = cuda.local.array(MV_MAX_N, float32)  # [n] this lane's partial outputs
        tid = cuda.threadIdx.x
        lane = tid % 32
        g = lane % 8  # 4-element group within the block
        m = w.shape[0]
        n = xq.shape[0]
        nblk = xq.shape[1] // 32
        r = cuda.blockIdx.x * MV_WARPS + tid // 32
        rr = min(r, m - 1)  # lanes past the last row compute it again (all lanes join the shuffles)
        for t in range(n):
            acc[t] = float32(0.0)
        for b0 in range(0, nblk, 4):
            b = b0 + lane // 8
            live = b < nblk
            bb = min(b, nblk - 1)
            u0, u1, u2, u3 = load4(w, rr, bb, g)
            s, c = scales(w, rr, bb, g // 4)
            xo = bb * 32 + 4 * g
            for t in range(n):
                x0 = int32(xq[t, xo])
                x1 = int32(xq[t, xo + 1])
                x2 = int32(xq[t, xo + 2])
                x3 = int32(xq[t, xo + 3])
                S = isum(int32(u0 * x0 + u1 * x1 + u2 * x2 + u3 * x3), gw, iscr, tid)
                if family == K16:  # per half-block: its activation sum, added by its first lane
                    X = isum(int32(x0 + x1 + x2 + x3), gw, iscr, tid)
                    first = g % 4 == 0
                else:
                    X = xs[t, bb]
                    first = g == 0
                if live and first:
                    acc[t] += term(S, X, xd[t, bb], s, c)
        store_matvec(y, acc, n, r, m, fscr, tid)

    return matvec


@cuda.jit(device=True, inline=True)
def _stage_group(tid, q):
    """(tile row or token, block of the stage, 4-element group) of thread tid's q-th copy."""
    e = tid + TILE_THREADS * q
    return e // (8 * STAGE_BLOCKS), (e // 8) % STAGE_BLOCKS, e % 8


def _make_weight_stage(load4, scales):
    @cuda.jit(device=True, inline=True)
    def weight_stage(w, st, nblk, r0, tid, su, ss, sc):
        """Decode blocks st .. st + STAGE_BLOCKS - 1 of rows r0 .. into shared memory: su [row,
        element] unsigned weights, ss / sc [row, 2 * block + half] scales and biases (zero past the
        row's end). Each thread decodes _W_GROUPS (row, block, 4-element group)s."""
        m = w.shape[0]
        for q in range(_W_GROUPS):
            i, jb, g = _stage_group(tid, q)
            b = st + jb
            rr = min(r0 + i, m - 1)
            if b < nblk:
                u0, u1, u2, u3 = load4(w, rr, b, g)
                if g < 2:
                    s, c = scales(w, rr, b, g)
                    ss[i, 2 * jb + g] = s
                    sc[i, 2 * jb + g] = c
            else:
                u0 = u1 = u2 = u3 = 0
                if g < 2:
                    ss[i, 2 * jb + g] = float32(0.0)
                    sc[i, 2 * jb + g] = float32(0.0)
            o = 32 * jb + 4 * g
            su[i, o] = u0
            su[i, o + 1] = u1
            su[i, o + 2] = u2
            su[i, o + 3] = u3

    return weight_stage


@cuda.jit(device=True, inline=True)
def _activation_stage(xq, xd, st, nblk, t0, tid, sx, sxd):
    """Copy the stage's int8 activations of tokens t0 .. to sx [token, element] and their block
    scales to sxd [token, block] (rows past the last token repeat it; their outputs are dropped)."""
    n = xq.shape[0]
    for q in range(_X_GROUPS):
        tt, jb, g = _stage_group(tid, q)
        b = min(st + jb, nblk - 1)
        tok = min(t0 + tt, n - 1)
        o = 32 * jb + 4 * g
        for z in range(4):
            sx[tt, o + z] = xq[tok, 32 * b + 4 * g + z]
        if g == 0:
            sxd[tt, jb] = xd[tok, b]


@cuda.jit(device=True, inline=True)
def _half_block_sums(sx, sxs, tid):
    """sxs [token, half-block] = sums of the stage's 16-element halves of activations."""
    for e in range(tid, TILE_TOKENS * 2 * STAGE_BLOCKS, TILE_THREADS):
        tt = e // (2 * STAGE_BLOCKS)
        hb = e % (2 * STAGE_BLOCKS)
        X = int32(0)
        for z in range(16):
            X += int32(sx[tt, 16 * hb + z])
        sxs[tt, hb] = X


@cuda.jit(device=True, inline=True)
def _block_dots(su, sx, jb, tid, lo, hi):
    """lo / hi[q] = int32 dots of elements 0-15 / 16-31 of the stage's block jb, between this
    thread's row and its q-th token; each weight byte serves all OUT_PER_THREAD tokens."""
    row = tid % TILE_ROWS
    o = 32 * jb
    for q in range(OUT_PER_THREAD):
        lo[q] = int32(0)
        hi[q] = int32(0)
    for z in range(16):
        wl = int32(su[row, o + z])
        wh = int32(su[row, o + 16 + z])
        for q in range(OUT_PER_THREAD):
            tt = tid // TILE_ROWS + TOK_STEP * q
            lo[q] += wl * int32(sx[tt, o + z])
            hi[q] += wh * int32(sx[tt, o + 16 + z])


def _make_tiled(load4, scales, family):
    weight_stage = _make_weight_stage(load4, scales)
    term = _legacy_term if family == LEGACY else _kquant_term

    @cuda.jit
    def tiled(w, xq, xd, xs, y):
        su = cuda.shared.array((TILE_ROWS, _SEP), uint8)  # decoded unsigned weights of the stage
        ss = cuda.shared.array((TILE_ROWS, _SH), float32)  # scale per (block, half)
        sc = cuda.shared.array((TILE_ROWS, _SH), float32)  # bias per (block, half)
        sx = cuda.shared.array((TILE_TOKENS, _SEP), int8)  # activations of the stage
        sxd = cuda.shared.array((TILE_TOKENS, STAGE_BLOCKS), float32)
        sxs = cuda.shared.array((TILE_TOKENS, _SH), int32)  # activation sums per half-block
        acc = cuda.local.array(OUT_PER_THREAD, float32)
        lo = cuda.local.array(OUT_PER_THREAD, int32)  # int32 dots of elements 0-15 / 16-31 of a block
        hi = cuda.local.array(OUT_PER_THREAD, int32)
        tid = cuda.threadIdx.x
        nblk = xq.shape[1] // 32
        r0 = cuda.blockIdx.x * TILE_ROWS
        t0 = cuda.blockIdx.y * TILE_TOKENS
        row = tid % TILE_ROWS  # this thread's outputs: row, tokens tid // TILE_ROWS + TOK_STEP q
        for q in range(OUT_PER_THREAD):
            acc[q] = float32(0.0)
        for st in range(0, nblk, STAGE_BLOCKS):
            weight_stage(w, st, nblk, r0, tid, su, ss, sc)
            _activation_stage(xq, xd, st, nblk, t0, tid, sx, sxd)
            cuda.syncthreads()
            _half_block_sums(sx, sxs, tid)
            cuda.syncthreads()
            for jb in range(STAGE_BLOCKS):
                _block_dots(su, sx, jb, tid, lo, hi)
                s0 = ss[row, 2 * jb]
                s1 = ss[row, 2 * jb + 1]
                c0 = sc[row, 2 * jb]
                c1 = sc[row, 2 * jb + 1]
                for q in range(OUT_PER_THREAD):
                    tt = tid // TILE_ROWS + TOK_STEP * q
                    dx = sxd[tt, jb]
                    X0 = sxs[tt, 2 * jb]
                    X1 = sxs[tt, 2 * jb + 1]
                    if family == K16:
                        acc[q] += _k16_term(lo[q], hi[q], X0, X1, dx, s0, s1, c0, c1)
                    else:
                        acc[q] += term(lo[q] + hi[q], X0 + X1, dx, s0, c0)
            cuda.syncthreads()
        store_tile(y, acc, t0, r0, tid)

    return tiled
