"""CPU matmul kernels for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS.

Every type shares one pair of kernels; a per-type decoder turns one 256-element superblock into
*unsigned* bytes q[256] plus float scales, so the integer dot is always u8 × i8 → int32 (VNNI):

    superblock contribution of 32-block b (activation scale xd, block sum xs, first-half sum xlo):
      one-dot types:  xd * (ws[b] * Σ_32 q·x            - wm[2b] * xlo - wm[2b+1] * (xs - xlo))
      Q6_K (split):   xd * (ws[2b] * Σ_lo q·x + ws[2b+1] * Σ_hi q·x - wm[2b] * xlo - wm[2b+1] * xhi)

Offsets and mins (Q2/Q4/Q5_K mins, Q3_K's -4, Q6_K's -32, IQ4_XS's +128 shift) become the wm terms
on per-16 activation sums, computed once per call. Q2_K and Q3_K fold their 16-element sub-block
scales into the weight bytes (|scale| × q fits a byte), so they need one 32-lane dot per block; Q6_K's
scales do not fit and it takes two 16-lane dots.

gemv (small n): per row, decode each superblock once, then one horizontal int32 dot per 32-block per
token. gemm: decode each superblock once per row and apply it to every 16-token tile with
simd.dot_u8i8_x16 (16 tokens' int32 sums in lanes, no horizontal sum).
"""

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.simd import TOKENS, dot_u8i8_x16
from edged.quant.f16 import f16_at

QK_K = 256
NBLK = QK_K // 32  # 32-element activation blocks per superblock

# type codes passed to the shared kernels
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS = 0, 1, 2, 3, 4, 5
_BLOCK_BYTES = np.array([84, 110, 144, 176, 210, 136], dtype=np.int64)

# IQ4_NL/IQ4_XS non-linear levels, shifted by +128 so they are unsigned bytes
_IQ4_LEVELS_U8 = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int32
) + 128
_IQ4_LEVELS_U8 = _IQ4_LEVELS_U8.astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Hot loops index with uint64 offsets and never slice: a slice costs two atomic refcount calls,
# and a signed index costs a negative-wraparound select that keeps LLVM from emitting vpdpbusd.
# Decoders: row uint8 [row_bytes], superblock at byte `o` (uint64) -> q uint8 [256] unsigned
# levels, ws float32 [16], wm float32 [16] (one-dot types use ws[0:8] per 32-block; Q6_K uses
# ws[0:16] per 16; wm is always per 16-half).
# ---------------------------------------------------------------------------------------------

_U = np.uint64


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_q2_k(row, o, q, ws, wm):
    # scales[16] | qs[64] | d | dmin; element e: qs[32*(e//128) + e%32] >> 2*((e%128)//32) & 3
    io = np.int64(o)
    d = f16_at(row, io + 80)
    dmin = f16_at(row, io + 82)
    for b in range(NBLK):
        src = o + _U(16 + 32 * (b // 4))
        sh = np.uint8(2 * (b % 4))
        sc_lo = row[io + 2 * b]
        sc_hi = row[io + 2 * b + 1]
        a_lo = sc_lo & np.uint8(0xF)
        a_hi = sc_hi & np.uint8(0xF)
        dst = _U(32 * b)
        for l in range(16):  # fold the 4-bit sub-block scale in: 3 * 15 fits a byte
            q[dst + _U(l)] = ((row[src + _U(l)] >> sh) & np.uint8(3)) * a_lo
        for l in range(16, 32):
            q[dst + _U(l)] = ((row[src + _U(l)] >> sh) & np.uint8(3)) * a_hi
        ws[b] = d
        wm[2 * b] = dmin * np.float32(sc_lo >> np.uint8(4))
        wm[2 * b + 1] = dmin * np.float32(sc_hi >> np.uint8(4))


@nb.njit(cache=True, nogil=True, inline="always")
def _q3_k_scale(row, io, i):
    """6-bit sub-block scale i of the Q3_K block at int offset io, minus 32 (-32..31)."""
    lo = (np.int32(row[io + 96 + i % 8]) >> (4 * (i // 8))) & 0xF
    hi = (np.int32(row[io + 104 + i % 4]) >> (2 * (i // 4))) & 3
    return (lo | (hi << 4)) - 32


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_q3_k(row, o, q, ws, wm):
    # hmask[32] | qs[64] | scales[12] | d; value = (u - 4) * sc with u = 2 low bits + 4 * hmask bit.
    # (u - 4) * sc = u' * |sc| - c * |sc| where u' = u, c = 4 for sc >= 0 and u' = 7 - u, c = 3
    # otherwise: u' * |sc| <= 7 * 32 fits a byte, so the scale folds into the weights.
    io = np.int64(o)
    d = f16_at(row, io + 108)
    for b in range(NBLK):
        src = o + _U(32 + 32 * (b // 4))
        sh = np.uint8(2 * (b % 4))
        bit = np.uint8(b)
        for half in range(2):
            sc = _q3_k_scale(row, io, 2 * b + half)
            flip = np.uint8(7) if sc < 0 else np.uint8(0)  # 7 - u == u ^ 7 for u in 0..7
            a = np.uint8(-sc if sc < 0 else sc)
            dst = _U(32 * b + 16 * half)
            for l in range(16):
                e = _U(16 * half + l)
                u = ((row[src + e] >> sh) & np.uint8(3)) | (((row[o + e] >> bit) & np.uint8(1)) << np.uint8(2))
                q[dst + _U(l)] = (u ^ flip) * a
            wm[2 * b + half] = d * np.float32(a) * np.float32(3.0 if sc < 0 else 4.0)
        ws[b] = d


@nb.njit(cache=True, nogil=True, inline="always")
def _q4_k_scale_min(row, so, j):
    """(scale, min) 6-bit pair j of the 12-byte Q4_K/Q5_K scale field at int offset so."""
    if j < 4:
        return row[so + j] & np.uint8(63), row[so + j + 4] & np.uint8(63)
    s = (row[so + j + 4] & np.uint8(0xF)) | ((row[so + j - 4] >> np.uint8(6)) << np.uint8(4))
    m = (row[so + j + 4] >> np.uint8(4)) | ((row[so + j] >> np.uint8(6)) << np.uint8(4))
    return s, m


@nb.njit(cache=True, nogil=True, inline="always")
def _k_scales(row, io, ws, wm):
    """Q4_K/Q5_K per-32 scales and mins: ws = d * scale, wm (both halves) = dmin * min."""
    d = f16_at(row, io)
    dmin = f16_at(row, io + 2)
    for b in range(NBLK):
        s, m = _q4_k_scale_min(row, io + 4, b)
        ws[b] = d * np.float32(s)
        wm[2 * b] = dmin * np.float32(m)
        wm[2 * b + 1] = wm[2 * b]


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_q4_k(row, o, q, ws, wm):
    # d | dmin | scales[12] | qs[128]; 32-block 2j: low nibbles of qs[32j:32j+32], 2j+1: high
    for j in range(4):
        src = o + _U(16 + 32 * j)
        dst = _U(64 * j)
        for l in range(32):
            v = row[src + _U(l)]
            q[dst + _U(l)] = v & np.uint8(0xF)
            q[dst + _U(32 + l)] = v >> np.uint8(4)
    _k_scales(row, np.int64(o), ws, wm)


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_q5_k(row, o, q, ws, wm):
    # d | dmin | scales[12] | qh[32] | qs[128]; fifth bit of 32-block b is bit b of qh[l]
    qh = o + _U(16)
    for j in range(4):
        src = o + _U(48 + 32 * j)
        dst = _U(64 * j)
        b0 = np.uint8(2 * j)
        b1 = np.uint8(2 * j + 1)
        for l in range(32):
            v = row[src + _U(l)]
            h = row[qh + _U(l)]
            q[dst + _U(l)] = (v & np.uint8(0xF)) | (((h >> b0) & np.uint8(1)) << np.uint8(4))
            q[dst + _U(32 + l)] = (v >> np.uint8(4)) | (((h >> b1) & np.uint8(1)) << np.uint8(4))
    _k_scales(row, np.int64(o), ws, wm)


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_q6_k(row, o, q, ws, wm):
    # ql[128] | qh[64] | scales[16] int8 | d; element e (h = e//128, p = e%128):
    # low 4 bits: ql[64h + p%64] >> 4*(p//64), high 2 bits: qh[32h + p%32] >> 2*(p//32); value u-32
    io = np.int64(o)
    d = f16_at(row, io + 208)
    for b in range(NBLK):
        h = b // 4
        p = b % 4
        ql = o + _U(64 * h + 32 * (p % 2))
        qh = o + _U(128 + 32 * h)
        nsh = np.uint8(4 * (p // 2))
        hsh = np.uint8(2 * p)
        dst = _U(32 * b)
        for l in range(32):
            lo = (row[ql + _U(l)] >> nsh) & np.uint8(0xF)
            q[dst + _U(l)] = lo | (((row[qh + _U(l)] >> hsh) & np.uint8(3)) << np.uint8(4))
    for i in range(16):
        s = d * np.float32(np.int8(row[io + 192 + i]))
        ws[i] = s
        wm[i] = np.float32(32.0) * s


@nb.njit(cache=True, nogil=True, inline="always")
def _decode_iq4_xs(row, o, q, ws, wm, levels):
    # d | scales_h u16 | scales_l[4] | qs[128]; 32-block b: low nibbles of qs[16b:16b+16], then high
    io = np.int64(o)
    d = f16_at(row, io)
    sh = np.int32(row[io + 2]) | (np.int32(row[io + 3]) << 8)
    for b in range(NBLK):
        src = o + _U(8 + 16 * b)
        dst = _U(32 * b)
        for l in range(16):
            v = row[src + _U(l)]
            q[dst + _U(l)] = levels[v & np.uint8(0xF)]
            q[dst + _U(16 + l)] = levels[v >> np.uint8(4)]
        ls = ((np.int32(row[io + 4 + b // 2]) >> (4 * (b % 2))) & 0xF) | (((sh >> (2 * b)) & 3) << 4)
        s = d * np.float32(ls - 32)
        ws[b] = s
        wm[2 * b] = np.float32(128.0) * s  # levels were shifted by +128
        wm[2 * b + 1] = wm[2 * b]


@nb.njit(cache=True, nogil=True, inline="always")
def _decode(qt, row, o, q, ws, wm, levels):
    if qt == Q4_K:
        _decode_q4_k(row, o, q, ws, wm)
    elif qt == Q6_K:
        _decode_q6_k(row, o, q, ws, wm)
    elif qt == Q5_K:
        _decode_q5_k(row, o, q, ws, wm)
    elif qt == Q2_K:
        _decode_q2_k(row, o, q, ws, wm)
    elif qt == Q3_K:
        _decode_q3_k(row, o, q, ws, wm)
    else:
        _decode_iq4_xs(row, o, q, ws, wm, levels)


# ---------------------------------------------------------------------------------------------
# integer dots (u8 weights × i8 activations, explicit int32 accumulation -> vpdpbusd)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, nogil=True, inline="always")
def _dot32(a, ao, x, xo):
    s = np.int32(0)
    for l in range(32):
        s = np.int32(s + np.int32(a[ao + _U(l)]) * np.int32(x[xo + _U(l)]))
    return np.float32(s)


@nb.njit(cache=True, nogil=True, inline="always")
def _dot16(a, ao, x, xo):
    s = np.int32(0)
    for l in range(16):
        s = np.int32(s + np.int32(a[ao + _U(l)]) * np.int32(x[xo + _U(l)]))
    return np.float32(s)


@nb.njit(cache=True, nogil=True, parallel=True)
def _first_half_sums(xq):
    """int32 [n, k/32]: sums of the first 16 activations of each 32-block."""
    n, k = xq.shape
    nb_ = k // 32
    out = np.empty((n, nb_), dtype=np.int32)
    for t in nb.prange(n):
        for b in range(nb_):
            s = np.int32(0)
            for l in range(16):
                s = np.int32(s + np.int32(xq[t, 32 * b + l]))
            out[t, b] = s
    return out


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def gemv_kquant(w, xq, xd, xs, y, qt, levels):
    """y[n, m] = x @ W.T for K-quant/IQ4_XS rows w uint8 [m, row_bytes] of type code `qt`.

    Per row and token: decode each superblock, then one int32 dot per 32-block (two 16-half dots
    for Q6_K). Meant for small n (decode): the decode is repeated per token."""
    m = w.shape[0]
    n, k = xq.shape
    nsb = k // QK_K
    bb = _BLOCK_BYTES[qt]
    split = qt == Q6_K
    xlo = _first_half_sums(xq)  # [n, k/32]
    rows_per_task = 8
    n_tasks = (m + rows_per_task - 1) // rows_per_task
    for task in nb.prange(n_tasks):
        q = np.empty(QK_K, dtype=np.uint8)
        ws = np.empty(16, dtype=np.float32)
        wm = np.empty(16, dtype=np.float32)
        for r in range(task * rows_per_task, min(m, (task + 1) * rows_per_task)):
            row = w[r]
            for t in range(n):
                xrow = xq[t]
                acc = np.float32(0.0)
                for i in range(nsb):
                    _decode(qt, row, _U(i * bb), q, ws, wm, levels)
                    xo = _U(i * QK_K)
                    for b in range(NBLK):
                        gb = i * NBLK + b
                        qo = _U(32 * b)
                        if split:
                            v = ws[2 * b] * _dot16(q, qo, xrow, xo + qo)
                            v += ws[2 * b + 1] * _dot16(q, qo + _U(16), xrow, xo + qo + _U(16))
                        else:
                            v = ws[b] * _dot32(q, qo, xrow, xo + qo)
                        lo = np.float32(xlo[t, gb])
                        hi = np.float32(xs[t, gb]) - lo
                        acc += xd[t, gb] * (v - wm[2 * b] * lo - wm[2 * b + 1] * hi)
                y[t, r] = acc


@nb.njit(cache=True, nogil=True, parallel=True)
def _prepare_tiles(xq, xd, xs):
    """Activations regrouped for 16-token tiles.

    Returns xi int8 [tiles * k/32 * 512] (each 32-block as [8 groups][16 tokens][4 bytes], as
    simd.dot_u8i8_x16 wants; missing tokens zero), and float32 [tiles, k/32, 16] arrays of
    xd, xd·(first-half sum) and xd·(second-half sum)."""
    n, k = xq.shape
    nb_ = k // 32
    tiles = (n + TOKENS - 1) // TOKENS
    xi = np.zeros(tiles * nb_ * 512, dtype=np.int8)
    xdt = np.zeros((tiles, nb_, TOKENS), dtype=np.float32)
    xlot = np.zeros((tiles, nb_, TOKENS), dtype=np.float32)
    xhit = np.zeros((tiles, nb_, TOKENS), dtype=np.float32)
    for tb in nb.prange(tiles * nb_):
        tile = tb // nb_
        b = tb % nb_
        base = tb * 512
        for t in range(min(TOKENS, n - tile * TOKENS)):
            tok = tile * TOKENS + t
            lo = np.int32(0)
            for l in range(16):
                lo = np.int32(lo + np.int32(xq[tok, 32 * b + l]))
            for g in range(8):
                for j in range(4):
                    xi[base + g * 64 + t * 4 + j] = xq[tok, 32 * b + 4 * g + j]
            d = xd[tok, b]
            xdt[tile, b, t] = d
            xlot[tile, b, t] = d * np.float32(lo)
            xhit[tile, b, t] = d * np.float32(xs[tok, b] - lo)
    return xi, xdt, xlot, xhit


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def gemm_kquant(w, xq, xd, xs, y, qt, levels):
    """y[n, m] = x @ W.T for larger n: each row's superblock is decoded once and applied to every
    16-token tile through simd.dot_u8i8_x16 (int32 lanes per token, no horizontal sums)."""
    m = w.shape[0]
    n, k = xq.shape
    nsb = k // QK_K
    nb_ = k // 32
    bb = _BLOCK_BYTES[qt]
    split = qt == Q6_K
    tiles = (n + TOKENS - 1) // TOKENS
    xi, xdt, xlot, xhit = _prepare_tiles(xq, xd, xs)
    rows_per_task = 4
    n_tasks = (m + rows_per_task - 1) // rows_per_task
    for task in nb.prange(n_tasks):
        q = np.empty(QK_K, dtype=np.uint8)
        qm = np.zeros(64, dtype=np.uint8)  # Q6_K: [lo16, 0 * 16, 0 * 16, hi16] of one block
        ws = np.empty(16, dtype=np.float32)
        wm = np.empty(16, dtype=np.float32)
        s = np.empty(TOKENS, dtype=np.int32)
        s2 = np.empty(TOKENS, dtype=np.int32)
        acc = np.empty((tiles, TOKENS), dtype=np.float32)
        for r in range(task * rows_per_task, min(m, (task + 1) * rows_per_task)):
            acc[:] = 0.0
            row = w[r]
            for i in range(nsb):
                _decode(qt, row, _U(i * bb), q, ws, wm, levels)
                for b in range(NBLK):
                    gb = i * NBLK + b
                    if split:
                        for l in range(16):
                            qm[l] = q[32 * b + l]
                            qm[48 + l] = q[32 * b + 16 + l]
                    m_lo = wm[2 * b]
                    m_hi = wm[2 * b + 1]
                    for tile in range(tiles):
                        xo = (tile * nb_ + gb) * 512
                        if split:
                            dot_u8i8_x16(qm, 0, xi, xo, s)
                            dot_u8i8_x16(qm, 32, xi, xo, s2)
                            s_lo = ws[2 * b]
                            s_hi = ws[2 * b + 1]
                            for t in range(TOKENS):
                                acc[tile, t] += (xdt[tile, gb, t] * (s_lo * np.float32(s[t]) + s_hi * np.float32(s2[t]))
                                                 - m_lo * xlot[tile, gb, t] - m_hi * xhit[tile, gb, t])
                        else:
                            dot_u8i8_x16(q, 32 * b, xi, xo, s)
                            sc = ws[b]
                            for t in range(TOKENS):
                                acc[tile, t] += (sc * xdt[tile, gb, t] * np.float32(s[t])
                                                 - m_lo * xlot[tile, gb, t] - m_hi * xhit[tile, gb, t])
            for tile in range(tiles):
                for t in range(min(TOKENS, n - tile * TOKENS)):
                    y[tile * TOKENS + t, r] = acc[tile, t]


class TypedKernel:
    """One type's kernel with the contract's signature f(w_rows, xq, xd, xs, y) -> None.

    All six types share the two compiled kernels (one specialization each, not twelve: Numba
    re-optimizes a callee into every caller); this binds the type code. `inspect_asm` and
    `signatures` are the shared dispatcher's, for VNNI checks and benches."""

    def __init__(self, name: str, kernel, code: int):
        self.__name__ = name
        self.kernel = kernel
        self.code = code

    def __call__(self, w, xq, xd, xs, y) -> None:
        self.kernel(w, xq, xd, xs, y, self.code, _IQ4_LEVELS_U8)

    @property
    def signatures(self):
        return self.kernel.signatures

    def inspect_asm(self, signature=None):
        return self.kernel.inspect_asm(signature if signature is not None else self.kernel.signatures[0])

    def __repr__(self) -> str:
        return f"<TypedKernel {self.__name__}>"


_CODES = {T.Q2_K: Q2_K, T.Q3_K: Q3_K, T.Q4_K: Q4_K, T.Q5_K: Q5_K, T.Q6_K: Q6_K, T.IQ4_XS: IQ4_XS}

KERNELS = {
    qtype: (
        TypedKernel(f"gemv_{qtype.name.lower()}", gemv_kquant, code),
        TypedKernel(f"gemm_{qtype.name.lower()}", gemm_kquant, code),
    )
    for qtype, code in _CODES.items()
}
