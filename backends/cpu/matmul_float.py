"""Matmul kernels for float weights: F32, F16, BF16 (float32 activations, float32 accumulation).

Contract (backends/cpu/matmul.py): f(w_rows uint8 [m, row_bytes], x float32 [n, k], y float32 [n, m]).
One kernel per type serves as both gemv and gemm: every product is a register tile `tile_dot`
(hand-written LLVM vector IR) of R weight rows x T tokens whose R·T accumulators of 16 float
lanes stay in registers over k; each 16-element weight slice is loaded (and widened from
F16/BF16) once for all T tokens, each activation slice once for all R rows.

Canonical float order (batch invariance): for every (row, token), lane l (0..15) accumulates
fma(w[j], x[j], acc_l) over j = l, l + 16, l + 32, ... in increasing j, starting from +0.0; the
last partial slice (k % 16 elements) is read with zeros in the missing lanes; then the 16 lanes
are summed by the fixed tree  s8[l] = a[l] + a[l+8],  s4[l] = s8[l] + s8[l+4],  s2[l] = s4[l] +
s4[l+2],  s = s2[0] + s2[1].  No fast-math flags: LLVM may not reorder any of it, so every tile
shape (R, T), hence every batch size, gives the same bits for the same (row, token).

Tile shapes (chosen by measurement, docs/kernels.md): n = 1: 8 rows x 1 token (1 x 1 under the
knob mode 1, which the tuner picks where it reads faster); n = 2: 8 x 2;
n = 3, 4: 4 x 4; n >= 5: 4 x 6 (24 accumulators + 4 weight vectors of the 32 AVX-512 registers),
the last n % 6 tokens by the small shapes. Rows past the
end are clamped to the last row and tokens to the last token: such a tile computes the last
row/token again (same order, same bits) and stores the same value to the same place, so partial
tiles need no extra compiled shapes. Weights are exact in float32 (F16 via vcvtph2ps, or integer
ops on hosts without F16C, which tests select by setting USE_F16C = False).
"""

import llvmlite.binding as llvm
import numba as nb
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edged.backends.cpu.kernel_threads import fewer_threads, restore_threads
from edged.backends.cpu.typed_kernel import TypedKernel

# Read at codegen time; tests set it to False (and compile uncached) to run the portable path.
USE_F16C = bool(llvm.get_host_cpu_features().get("f16c", False))

F32, F16, BF16 = 0, 1, 2  # weight kinds (compile-time literals)
LANES = 16  # float lanes per accumulator: one 512-bit vector

_I1, _I16, _I32, _I64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F = ir.FloatType()
_V16F = ir.VectorType(_F, LANES)
_V16I16 = ir.VectorType(_I16, LANES)
_V16I32 = ir.VectorType(_I32, LANES)
_V16I1 = ir.VectorType(_I1, LANES)


def _shuf(builder, a, idx, b=None):
    idx = list(idx)
    return builder.shuffle_vector(a, b if b is not None else ir.Constant(a.type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _splat_i32(builder, v):
    vec = builder.insert_element(ir.Constant(_V16I32, ir.Undefined), v, ir.Constant(_I32, 0))
    return _shuf(builder, vec, [0] * LANES)


def _f16_to_f32(builder, h):
    """Exact <16 x float> of <16 x i16> IEEE half bit patterns. With F16C an fpext (vcvtph2ps);
    otherwise integer ops (an fpext there may become a libcall Numba does not link): the bits
    moved to float32 position and scaled by 2^112 (exact for normals and subnormals), exponent 31
    (inf / NaN) patched separately."""
    if USE_F16C:
        return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), LANES)), _V16F)
    c = lambda v: ir.Constant(_V16I32, [v] * LANES)  # noqa: E731
    h = builder.zext(h, _V16I32)
    sign = builder.shl(builder.and_(h, c(0x8000)), c(16))
    em = builder.shl(builder.and_(h, c(0x7FFF)), c(13))
    scaled = builder.fmul(builder.bitcast(em, _V16F), ir.Constant(_V16F, [2.0**112] * LANES))
    special = builder.icmp_unsigned("==", builder.and_(h, c(0x7C00)), c(0x7C00))
    bits = builder.select(special, builder.or_(em, c(0x7F800000)), builder.bitcast(scaled, _V16I32))
    return builder.bitcast(builder.or_(bits, sign), _V16F)


def _bf16_to_f32(builder, h):
    """Exact <16 x float> of <16 x i16> bfloat16 bit patterns (the high half of a float32)."""
    return builder.bitcast(builder.shl(builder.zext(h, _V16I32), ir.Constant(_V16I32, [16] * LANES)), _V16F)


def _load_w(builder, kind, rowp, j, mask=None):
    """<16 x float> weights j..j+15 of the row at i8* rowp (lanes off in `mask` read as 0)."""
    mod = builder.module
    if kind == F32:
        p = builder.bitcast(builder.gep(builder.bitcast(rowp, _F.as_pointer()), [j]), _V16F.as_pointer())
        if mask is None:
            return builder.load(p, align=4)
        fn = cgutils.get_or_insert_function(
            mod, ir.FunctionType(_V16F, [_V16F.as_pointer(), _I32, _V16I1, _V16F]), "llvm.masked.load.v16f32.p0v16f32")
        return builder.call(fn, [p, ir.Constant(_I32, 4), mask, ir.Constant(_V16F, None)])
    p = builder.bitcast(builder.gep(builder.bitcast(rowp, _I16.as_pointer()), [j]), _V16I16.as_pointer())
    if mask is None:
        h = builder.load(p, align=2)
    else:
        fn = cgutils.get_or_insert_function(
            mod, ir.FunctionType(_V16I16, [_V16I16.as_pointer(), _I32, _V16I1, _V16I16]), "llvm.masked.load.v16i16.p0v16i16")
        h = builder.call(fn, [p, ir.Constant(_I32, 2), mask, ir.Constant(_V16I16, None)])
    return _f16_to_f32(builder, h) if kind == F16 else _bf16_to_f32(builder, h)


def _load_x(builder, xp, j, mask=None):
    p = builder.bitcast(builder.gep(xp, [j]), _V16F.as_pointer())
    if mask is None:
        return builder.load(p, align=4)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V16F, [_V16F.as_pointer(), _I32, _V16I1, _V16F]), "llvm.masked.load.v16f32.p0v16f32")
    return builder.call(fn, [p, ir.Constant(_I32, 4), mask, ir.Constant(_V16F, None)])


def _reduce(builder, accs):
    """Scalar tree sums of several 16-lane accumulators (the canonical tree of the module doc),
    computed on whole vectors: each stage packs the low and high halves of every accumulator's
    live lanes from two vectors and adds them, so 16 accumulators take 15 vector adds."""
    zero = ir.Constant(_V16F, None)
    vecs, width = list(accs), LANES  # each vector holds LANES // width accumulators of `width` lanes
    while width > 1:
        half = width // 2
        if len(vecs) % 2:
            vecs.append(zero)
        nxt = []
        for a, b in zip(vecs[0::2], vecs[1::2]):
            segs = range(0, 2 * LANES, width)  # segment starts in concat(a, b)
            lo = _shuf(builder, a, [s + i for s in segs for i in range(half)], b)
            hi = _shuf(builder, a, [s + half + i for s in segs for i in range(half)], b)
            nxt.append(builder.fadd(lo, hi))
        vecs, width = nxt, half
    # after log2(16) stages the vector list holds accumulator q at vecs[q // 16] lane q % 16
    return [builder.extract_element(vecs[q // LANES], ir.Constant(_I32, q % LANES)) for q in range(len(accs))]


def _tile_args_ok(kind, R, TK, w, x, y, r0, t0, pf):
    lit = lambda a: isinstance(a, types.IntegerLiteral)  # noqa: E731
    c2 = lambda a, dt: isinstance(a, types.Array) and a.ndim == 2 and a.dtype == dt and a.layout == "C"  # noqa: E731
    return (lit(kind) and kind.literal_value in (F32, F16, BF16) and lit(R) and lit(TK)
            and 1 <= R.literal_value and 1 <= TK.literal_value and R.literal_value * TK.literal_value <= 32
            and c2(w, types.uint8) and c2(x, types.float32) and c2(y, types.float32)
            and isinstance(r0, types.Integer) and isinstance(t0, types.Integer)
            and (isinstance(pf, types.IntegerLiteral) and pf.literal_value == -1 or isinstance(pf, types.Integer)))


@intrinsic
def tile_dot(typingctx, kind, R, TK, w, x, y, r0, t0, pf):
    """y[t, r] = W[r] · x[t] (canonical order) for rows r0 .. r0+R-1 and tokens t0 .. t0+TK-1, rows
    clamped to m - 1 and tokens to n - 1. kind (F32/F16/BF16), R, TK: integer literals; w uint8
    [m, row_bytes] C-contiguous; x float32 [n, k] and y float32 [n, m] C-contiguous; r0 < m,
    t0 < n (not checked). pf: -1, or a row whose R rows (clamped) are prefetched alongside (one
    cache line per row per 16-element step), so the next strip streams in during this one."""
    if not _tile_args_ok(kind, R, TK, w, x, y, r0, t0, pf):
        return None
    kv, nr, nt = kind.literal_value, R.literal_value, TK.literal_value
    prefetch = not (isinstance(pf, types.IntegerLiteral) and pf.literal_value == -1)
    sig = types.void(kind, R, TK, w, x, y, r0, t0, pf)

    def codegen(context, builder, signature, args):
        _, _, _, wa, xa, ya, r0v, t0v, pfv = args
        at = signature.args
        r0v = context.cast(builder, r0v, at[6], types.intp)
        t0v = context.cast(builder, t0v, at[7], types.intp)
        wary = context.make_array(at[3])(context, builder, wa)
        xary = context.make_array(at[4])(context, builder, xa)
        yary = context.make_array(at[5])(context, builder, ya)
        m = builder.extract_value(wary.shape, 0)
        wstride = builder.extract_value(wary.strides, 0)
        n = builder.extract_value(xary.shape, 0)
        k = builder.extract_value(xary.shape, 1)
        wbase = builder.bitcast(wary.data, ir.IntType(8).as_pointer())
        xbase = builder.bitcast(xary.data, _F.as_pointer())
        ybase = builder.bitcast(yary.data, _F.as_pointer())
        one = ir.Constant(_I64, 1)

        def clamp(base, i, limit):
            v = builder.add(base, ir.Constant(_I64, i))
            last = builder.sub(limit, one)
            return builder.select(builder.icmp_signed("<", v, last), v, last)

        rows = [clamp(r0v, i, m) for i in range(nr)]
        toks = [clamp(t0v, t, n) for t in range(nt)]
        wps = [builder.gep(wbase, [builder.mul(r, wstride)]) for r in rows]
        xps = [builder.gep(xbase, [builder.mul(t, k)]) for t in toks]
        if prefetch:
            pfv = context.cast(builder, pfv, at[8], types.intp)
            pfps = [builder.gep(wbase, [builder.mul(clamp(pfv, i, m), wstride)]) for i in range(nr)]
            prefetch_fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32]), "llvm.prefetch.p0i8")
        wsize = 4 if kv == F32 else 2
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F, [_V16F] * 3), "llvm.fma.v16f32")
        accp = [[cgutils.alloca_once_value(builder, ir.Constant(_V16F, None)) for _ in range(nr)] for _ in range(nt)]

        def step(j, mask=None):
            wv = [_load_w(builder, kv, wp, j, mask) for wp in wps]
            if prefetch and mask is None:  # read, keep in all cache levels
                for pp in pfps:
                    args = [builder.gep(pp, [builder.mul(j, ir.Constant(_I64, wsize))])] + [ir.Constant(_I32, v) for v in (0, 3, 1)]
                    builder.call(prefetch_fn, args)
            for t in range(nt):
                xv = _load_x(builder, xps[t], j, mask)
                for i in range(nr):
                    builder.store(builder.call(fma, [wv[i], xv, builder.load(accp[t][i])]), accp[t][i])

        nfull = builder.udiv(k, ir.Constant(_I64, LANES))
        with cgutils.for_range(builder, nfull) as loop:
            step(builder.mul(loop.index, ir.Constant(_I64, LANES)))
        jtail = builder.mul(nfull, ir.Constant(_I64, LANES))
        rem = builder.sub(k, jtail)
        with builder.if_then(builder.icmp_signed(">", rem, ir.Constant(_I64, 0)), likely=False):
            lane = ir.Constant(_V16I32, list(range(LANES)))
            mask = builder.icmp_signed("<", lane, _splat_i32(builder, builder.trunc(rem, _I32)))
            step(jtail, mask)

        accs = [builder.load(accp[t][i]) for t in range(nt) for i in range(nr)]
        sums = _reduce(builder, accs)
        for t in range(nt):
            yrow = builder.gep(ybase, [builder.mul(toks[t], m)])
            for i in range(nr):
                builder.store(sums[t * nr + i], builder.gep(yrow, [rows[i]]))
        return context.get_dummy_value()

    return sig, codegen


# ------------------------------------------------------------------ kernels

L2_ROWS_BYTES = 512 * 1024  # a gemm task's weight rows stay in L2 while its token blocks pass
X_BLOCK_BYTES = 256 * 1024  # a token block's activations stay in L2 while its rows pass


@nb.njit(nogil=True, cache=True, inline="always")
def _tail_tokens(kind, w, x, y, r_lo, r_hi, t0, t1):
    """Tokens t0 .. t1 - 1 (at most 5; t1 = n or a 6-token tile follows) for rows r_lo .. r_hi - 1
    (r_lo a multiple of 8)."""
    left = t1 - t0
    if left == 1:
        for r0 in range(r_lo, r_hi, 8):
            tile_dot(kind, 8, 1, w, x, y, r0, t0, -1)
    elif left == 2:
        for r0 in range(r_lo, r_hi, 8):
            tile_dot(kind, 8, 2, w, x, y, r0, t0, -1)
    elif left <= 4:  # 3 tokens: the last one computed twice (same bits, same place)
        for r0 in range(r_lo, r_hi, 4):
            tile_dot(kind, 4, 4, w, x, y, r0, t0, -1)
    elif left == 5:
        for r0 in range(r_lo, r_hi, 4):
            tile_dot(kind, 4, 6, w, x, y, r0, t0, -1)


@nb.njit(nogil=True, cache=True, inline="always")
def _rows_per_task(m, row_bytes, tasks):
    """gemm rows per prange task, a multiple of 8: for `tasks` tasks, or (tasks 0) few enough to
    stay in L2 with a task count that is a multiple of 8, so static scheduling splits it evenly
    over 1, 2, 4 or 8 threads."""
    if tasks > 0:
        return max(8, (-(-m // tasks) + 7) // 8 * 8)
    ntask = max(1, -(-m * row_bytes // L2_ROWS_BYTES))
    ntask = -(-ntask // 8) * 8
    per_task = -(-m // ntask)
    return max(8, (per_task + 7) // 8 * 8)


@nb.njit(nogil=True, cache=True, inline="always")
def _matmul_body(kind, w, x, y, tasks, pf, mode):
    """n <= 4: one pass over the weights in tiles of 8 (n <= 2) or 4 rows, parallel over rows.
    Larger n: tasks of `rb` rows (L2-sized) parallel over rows; in each, blocks of `tb` tokens
    (L2-sized); in each block, 8 rows at a time meet all its 6-token tiles, then its n % 6 last
    tokens. So weights stream from memory once, spread evenly over the compute (each 8-row strip
    serves every token of the block while it sits in L1/L2), and later token blocks find them in L2.
    Knobs (matmul.py; neither changes a tile's arithmetic): tasks, the prange steps (0: one per 8
    rows for n <= 4, L2-sized above); pf, the prefetch distance in rows of a strip's first pass
    (0: 8 for F16/BF16, none for F32; -1: none); mode 1 at n = 1, one-row tiles: the weights read
    as one ascending stream, which from DRAM beat eight rows' interleaved streams (docs/kernels.md)."""
    m = w.shape[0]
    n, k = x.shape
    if n <= 4:
        groups = (m + 7) // 8
        per = 1 if tasks <= 0 else max(1, -(-groups // tasks))  # 8-row groups per task
        for g0 in nb.prange((groups + per - 1) // per):
            for g in range(g0 * per, min(groups, g0 * per + per)):
                if n == 1 and mode == 1:
                    for r in range(8 * g, min(m, 8 * g + 8)):
                        tile_dot(kind, 1, 1, w, x, y, r, 0, -1)
                else:
                    _tail_tokens(kind, w, x, y, 8 * g, min(m, 8 * g + 8), 0, n)
        return
    rb = _rows_per_task(m, w.shape[1], tasks)
    tb = max(6, X_BLOCK_BYTES // max(1, 4 * k) // 6 * 6)  # tokens per block, a multiple of 6
    ahead = pf if pf != 0 else (8 if kind != F32 else -1)
    for task in nb.prange((m + rb - 1) // rb):
        r_lo = task * rb
        r_hi = min(m, r_lo + rb)
        for b0 in range(0, n, tb):
            b1 = min(n, b0 + tb)
            b6 = b0 + (b1 - b0) // 6 * 6
            for r8 in range(r_lo, r_hi, 8):
                for t0 in range(b0, b6, 6):
                    # first pass over the strip: fetch a later one (by default F16/BF16 only: for
                    # F32 a line per row per step cost more than it saved; docs/kernels.md)
                    if ahead > 0 and t0 == 0 and r8 + ahead < r_hi:
                        tile_dot(kind, 4, 6, w, x, y, r8, t0, r8 + ahead)
                        tile_dot(kind, 4, 6, w, x, y, r8 + 4, t0, r8 + ahead + 4)
                    else:
                        tile_dot(kind, 4, 6, w, x, y, r8, t0, -1)
                        if r8 + 4 < r_hi:
                            tile_dot(kind, 4, 6, w, x, y, r8 + 4, t0, -1)
                if b6 < b1:
                    _tail_tokens(kind, w, x, y, r8, min(r_hi, r8 + 8), b6, b1)


# One kernel per type serves as both gemv and gemm: it picks its tile shapes from n.


# knobs (tasks, pf, mode, threads): see _matmul_body and kernel_threads; TypedKernel
# passes them on every call
@nb.njit(parallel=True, nogil=True, cache=True)
def matmul_f32(w, x, y, tasks=0, pf=0, mode=0, threads=0):
    """F32 rows: 4-byte little-endian IEEE floats."""
    prev = fewer_threads(threads)
    _matmul_body(F32, w, x, y, tasks, pf, mode)
    restore_threads(prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def matmul_f16(w, x, y, tasks=0, pf=0, mode=0, threads=0):
    """F16 rows: IEEE binary16, widened exactly."""
    prev = fewer_threads(threads)
    _matmul_body(F16, w, x, y, tasks, pf, mode)
    restore_threads(prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def matmul_bf16(w, x, y, tasks=0, pf=0, mode=0, threads=0):
    """BF16 rows: the high 16 bits of a float32, widened exactly."""
    prev = fewer_threads(threads)
    _matmul_body(BF16, w, x, y, tasks, pf, mode)
    restore_threads(prev)


def _bound(kernel):
    k = TypedKernel(kernel.__name__, kernel)
    return k, k


KERNELS = {T.F32: _bound(matmul_f32), T.F16: _bound(matmul_f16), T.BF16: _bound(matmul_bf16)}

# knobs the tuner may try beside tasks (backends/cpu/tuning.py): one-row tiles at n = 1 (mode 1), gemm
# prefetch rows ahead (-1: none)
KNOBS = {"n1": {"mode": (1,)}, "gemv": {}, "gemm": {"prefetch": (-1, 16)}}
