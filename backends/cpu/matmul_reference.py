"""Plain numpy reference of exactly what the fast matmul kernels compute, for every weight type.

llama.cpp keeps a scalar `_generic` beside every SIMD kernel; this is edged's. No SIMD tricks,
no Numba: each function is the kernels' arithmetic written out, and tests compare the kernels to
it bit for bit (tests/backends/test_matmul_reference.py). Per family:
  activations   quantize_q8_32 / quantize_q8_K: act_quant's int8 blocks (xq, xd, xs)
  weights       decode_legacy / decode_kquant: raw GGUF blocks -> unsigned bytes u, float scale s
                (or d) and bias c with w = s·u + c, as the kernels' in-register decoders read them
  block dot     block_dots: exact int32 Σ u·xq per block (per 16-half for the per-16 types)
  epilogue      the float32 block terms and their fixed summation order (legacy: the canonical
                8-lane order of legacy_blocks.py; K-quants: kquant_gemm_tile.py's superblock
                tree; float: matmul_float.py's 16 fma lanes and lane tree)
numpy float32 arithmetic rounds every operation to float32, so writing the same operations in
the same order gives the same bits. Slow: for tests only.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.vector_ir import IQ4_LEVELS_U8
from edged.quant.tensor import QTensor

QK, QK_K = 32, 256
_F = np.float32
_LEVELS = np.array(IQ4_LEVELS_U8, np.uint8)  # IQ4 codebook + 128


# ------------------------------------------------------------------------------- activations


def quantize_q8_32(x):
    """x float32 [n, k] -> (xq int8 [n, k], xd float32 [n, k/32], xs int32 [n, k/32]): per 32
    values d = max|x| / 127, q = rint(x · (1/d)) (0 where d = 0), xs = Σ q."""
    n, k = x.shape
    xb = x.reshape(n, k // QK, QK)
    d = np.abs(xb).max(axis=2) / _F(127.0)  # [n, k/32]
    inv = np.where(d > 0, _F(1.0) / np.where(d > 0, d, _F(1.0)), _F(0.0)).astype(_F)
    q = np.rint(xb * inv[:, :, None]).astype(np.int32)
    return q.astype(np.int8).reshape(n, k), d.astype(_F), q.sum(axis=2).astype(np.int32)


def quantize_q8_K(x):
    """llama.cpp's Q8_K grid in the per-32 layout: per 256 values iscale = -127 / (the first value
    of largest magnitude), q = min(127, rint(x · iscale)), d = 1 / iscale in all 8 per-32 entries."""
    n, k = x.shape
    xb = x.reshape(n, k // QK_K, QK_K)
    first = np.abs(xb).argmax(axis=2)  # argmax returns the first maximum
    mx = np.take_along_axis(xb, first[:, :, None], axis=2)[:, :, 0]  # [n, k/256]
    live = mx != 0
    iscale = np.where(live, _F(-127.0) / np.where(live, mx, _F(1.0)), _F(0.0)).astype(_F)
    d = np.where(live, _F(1.0) / np.where(live, iscale, _F(1.0)), _F(0.0)).astype(_F)
    q = np.minimum(np.rint(xb * iscale[:, :, None]), _F(127.0)).astype(np.int32).reshape(n, k // QK, QK)
    return q.astype(np.int8).reshape(n, k), np.repeat(d, QK_K // QK, axis=1), q.sum(axis=2).astype(np.int32)


# ------------------------------------------------------------------------------- weights


def _f16(b, off):
    """float32 of the fp16 field at byte `off` of every block (b uint8 [..., block bytes])."""
    return b[..., off : off + 2].copy().view(np.float16)[..., 0].astype(_F)


def _nibbles(qs):
    """qs uint8 [..., 16] -> [..., 32]: low nibbles are elements 0-15, high ones 16-31."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _bits(word_bytes, nbits):
    """Little-endian bit j of each [..., nbits / 8] byte group -> uint8 [..., nbits]."""
    return np.unpackbits(word_bytes, axis=-1, bitorder="little")[..., :nbits]


# B of the symmetric types (w = d·(u - B), c = -B·d): the kernels subtract B·xs from the integer
# dot, not c·xs in float
LEGACY_INT_BIAS = {T.Q8_0: 128, T.Q4_0: 8, T.Q5_0: 16, T.IQ4_NL: 128}


def _symmetric(qtype, u, b):
    """(u, d, c = -B·d) of a symmetric type's blocks b."""
    d = _f16(b, 0)
    return u, d, d * _F(-LEGACY_INT_BIAS[qtype])


# per legacy type: (block bytes, decode(blocks) -> (u [.., 32], d, c))
def _q8_0(b):
    return _symmetric(T.Q8_0, b[..., 2:34] ^ np.uint8(0x80), b)  # u = q + 128


def _q4_0(b):
    return _symmetric(T.Q4_0, _nibbles(b[..., 2:18]), b)


def _q4_1(b):
    return _nibbles(b[..., 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b):
    return _symmetric(T.Q5_0, _nibbles(b[..., 6:22]) | (_bits(b[..., 2:6], 32) << 4), b)


def _q5_1(b):
    return _nibbles(b[..., 8:24]) | (_bits(b[..., 4:8], 32) << 4), _f16(b, 0), _f16(b, 2)


def _iq4_nl(b):
    return _symmetric(T.IQ4_NL, _LEVELS[_nibbles(b[..., 2:18])], b)  # levels + 128


LEGACY = {T.Q8_0: (34, _q8_0), T.Q4_0: (18, _q4_0), T.Q4_1: (20, _q4_1), T.Q5_0: (22, _q5_0),
          T.Q5_1: (24, _q5_1), T.IQ4_NL: (18, _iq4_nl)}


def decode_legacy(w: QTensor):
    """(u uint8 [m, k/32, 32], d float32 [m, k/32], c float32 [m, k/32]): w = d·u + c."""
    size, dec = LEGACY[w.qtype]
    m, k = w.shape
    return dec(w.rows().reshape(m, k // QK, size))


def _q4k_scale_min(sc):
    """Q4_K / Q5_K's 12-byte fields [..., 12] -> 6-bit (scale, min) [..., 8] each."""
    lo, hi = sc[..., 0:4], sc[..., 4:8]
    scale = np.concatenate([lo & 63, (sc[..., 8:12] & 15) | ((lo >> 6) << 4)], axis=-1)
    mins = np.concatenate([hi & 63, (sc[..., 8:12] >> 4) | ((hi >> 6) << 4)], axis=-1)
    return scale, mins


def _q4k(b, q5=False):
    d, dmin = _f16(b, 0), _f16(b, 2)
    scale, mins = _q4k_scale_min(b[..., 4:16])
    qs = b[..., 48:176] if q5 else b[..., 16:144]  # [.., 128]: 32-byte runs, low then high nibbles
    u = np.stack([qs.reshape(*qs.shape[:-1], 4, 32) & 15, qs.reshape(*qs.shape[:-1], 4, 32) >> 4], axis=-2)
    u = u.reshape(*qs.shape[:-1], 8, 32)  # block 2i: low nibbles of run i, block 2i+1: high
    if q5:  # bit j of qh[l] is the fifth bit of element l of block j
        u = u | ((b[..., 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1).swapaxes(-1, -2) << 4
    return u, scale.astype(_F) * d[..., None], mins.astype(_F) * (-dmin)[..., None]


def _iq4xs(b):
    d = _f16(b, 0)
    sh = b[..., 2].astype(np.uint32) | (b[..., 3].astype(np.uint32) << 8)
    j = np.arange(8)
    low = (b[..., 4 + j // 2] >> (4 * (j % 2))) & 15
    ls = (low.astype(np.int32) | (((sh[..., None] >> (2 * j)) & 3).astype(np.int32) << 4)) - 32
    s = ls.astype(_F) * d[..., None]
    return _LEVELS[_nibbles(b[..., 8:136].reshape(*b.shape[:-1], 8, 16))], s, s * _F(-128.0)


def _q6k(b):
    ql, qh = b[..., 0:128], b[..., 128:192]
    u = np.empty(b.shape[:-1] + (256,), np.uint8)
    for h in range(2):  # 128-element halves
        l4, hb = ql[..., 64 * h : 64 * h + 64], qh[..., 32 * h : 32 * h + 32]
        for i, (lo, shift) in enumerate(((l4[..., :32] & 15, 0), (l4[..., 32:] & 15, 2), (l4[..., :32] >> 4, 4), (l4[..., 32:] >> 4, 6))):
            u[..., 128 * h + 32 * i : 128 * h + 32 * i + 32] = lo | (((hb >> shift) & 3) << 4)
    s = b[..., 192:208].view(np.int8).astype(_F) * _f16(b, 208)[..., None]
    return u.reshape(*b.shape[:-1], 8, 32), s, s * _F(-32.0)


def _low2(qs, nbytes_run=32):
    """Q2_K / Q3_K 2-bit quants [..., 256]: element e takes bits 2·((e % 128) // 32) of
    qs[32·(e // 128) + e % 32]."""
    out = [(qs[..., 32 * h : 32 * h + 32] >> (2 * i)) & 3 for h in range(2) for i in range(4)]
    return np.concatenate(out, axis=-1)


def _q3k(b):
    u = _low2(b[..., 32:96]) | (np.concatenate([(b[..., 0:32] >> i) & 1 for i in range(8)], axis=-1) << 2)
    i = np.arange(16)
    low = (b[..., 96 + i % 8] >> (4 * (i // 8))) & 15
    high = (b[..., 104 + i % 4] >> (2 * (i // 4))) & 3
    s = ((low.astype(np.int32) | (high.astype(np.int32) << 4)) - 32).astype(_F) * _f16(b, 108)[..., None]
    return u.reshape(*b.shape[:-1], 8, 32), s, s * _F(-4.0)


def _q2k(b):
    sc = b[..., 0:16]
    s = (sc & 15).astype(_F) * _f16(b, 80)[..., None]
    c = (sc >> 4).astype(_F) * (-_f16(b, 82))[..., None]
    return _low2(b[..., 16:80]).reshape(*b.shape[:-1], 8, 32), s, c


# per K-quant type: (block bytes, decode, family, B of c = -B·s folded into the integer dots)
KQUANTS = {T.Q4_K: (144, _q4k, "s32", 0), T.Q5_K: (176, lambda b: _q4k(b, True), "s32", 0),
           T.IQ4_XS: (136, _iq4xs, "s32", 0), T.Q6_K: (210, _q6k, "s16i", 32), T.Q3_K: (110, _q3k, "s16i", 4),
           T.Q2_K: (84, _q2k, "s16", 0)}


def decode_kquant(w: QTensor):
    """(u uint8 [m, k/32, 32], s, c float32 [m, k/32] (per-32 types) or [m, k/16] (per-16 types)):
    w = s·u + c per 32 (or 16) elements."""
    size, dec, _, _ = KQUANTS[w.qtype]
    m, k = w.shape
    u, s, c = dec(w.rows().reshape(m, k // QK_K, size))
    return u.reshape(m, k // QK, QK), s.reshape(m, -1), c.reshape(m, -1)


def dequantize(w: QTensor):
    """float64 [m, k] weights from the decoders (s·u + c), to check them against gguf-py."""
    if w.qtype in LEGACY:
        u, s, c = decode_legacy(w)
        return (u * s[..., None].astype(np.float64) + c[..., None]).reshape(w.shape)
    u, s, c = decode_kquant(w)
    m, k = w.shape
    g = k // s.shape[1]  # elements per scale
    u = u.reshape(m, -1, g)
    return (u * s[..., None].astype(np.float64) + c[..., None]).reshape(w.shape)


# ------------------------------------------------------------------------------- integer block dots


def block_dots(u, xq, width=QK):
    """Exact Σ u·xq per `width` elements: u uint8 [m, k/32, 32], xq int8 [n, k] -> int32
    [n, m, k/width] (the kernels' vpdpbusd sums, per block or per 16-half)."""
    m = u.shape[0]
    n, k = xq.shape
    uu = u.reshape(m, k // width, width).astype(np.int64)
    xx = xq.reshape(n, k // width, width).astype(np.int64)
    return np.einsum("mbj,nbj->nmb", uu, xx).astype(np.int32)


# ------------------------------------------------------------------------------- float epilogues


def _legacy_epilogue(d, c, S, xd, xs, bias=0):
    """T_b = xd_b · (d_b · float(S_b - B·xs_b)) for a symmetric type (bias B > 0), else
    xd_b · (d_b · S_b + c_b · xs_b); lane j = +0.0 + T_j + T_{j+8} + ...; the result is
    ((L0 + L4) + (L2 + L6)) + ((L1 + L5) + (L3 + L7)) (legacy_blocks' canonical order)."""
    if bias:
        exact = S.astype(np.int64) - bias * xs[:, None, :].astype(np.int64)  # [n, m, nblk], fits int32
        t = xd[:, None, :] * (d[None] * exact.astype(_F))
    else:
        t = xd[:, None, :] * (d[None] * S.astype(_F) + c[None] * xs[:, None, :].astype(_F))  # [n, m, nblk]
    lanes = np.zeros(t.shape[:2] + (8,), _F)
    for b in range(t.shape[2]):
        lanes[:, :, b % 8] = lanes[:, :, b % 8] + t[:, :, b]
    L = [lanes[:, :, j] for j in range(8)]
    return ((L[0] + L[4]) + (L[2] + L[6])) + ((L[1] + L[5]) + (L[3] + L[7]))


def _kquant_terms(family, B, s, c, S16, xq, xd, xs):
    """Block terms float32 [n, m, k/32] (kquant_gemm_tile's, op for op) from the per-16 dots S16."""
    lo, hi = S16[:, :, 0::2], S16[:, :, 1::2]  # [n, m, nblk]
    xlo = xq.reshape(xq.shape[0], -1, 2, 16)[:, :, 0].astype(np.int64).sum(axis=2).astype(np.int32)  # [n, nblk]
    xd3 = xd[:, None, :]
    if family == "s32":
        xb = xd * xs.astype(_F)  # activation scale × block sum
        return (lo + hi).astype(_F) * (xd3 * s[None]) + c[None] * xb[:, None, :]
    s_lo, s_hi = s[None, :, 0::2], s[None, :, 1::2]
    if family == "s16i":
        blo, bhi = (B * xlo)[:, None, :], (B * (xs - xlo))[:, None, :]
        return xd3 * ((lo - blo).astype(_F) * s_lo + (hi - bhi).astype(_F) * s_hi)
    xb_lo, xb_hi = (xd * xlo.astype(_F))[:, None, :], (xd * (xs - xlo).astype(_F))[:, None, :]
    v = lo.astype(_F) * (xd3 * s_lo) + hi.astype(_F) * (xd3 * s_hi)
    return v + (c[None, :, 0::2] * xb_lo + c[None, :, 1::2] * xb_hi)


def _superblock_sum(t):
    """Σ over superblocks, in order from +0.0, of ((w0+w1)+(w2+w3))+((w4+w5)+(w6+w7))."""
    acc = np.zeros(t.shape[:2], _F)
    for sb in range(0, t.shape[2], 8):
        w = [t[:, :, sb + j] for j in range(8)]
        acc = acc + (((w[0] + w[1]) + (w[2] + w[3])) + ((w[4] + w[5]) + (w[6] + w[7])))
    return acc


def _fma32(a, b, acc):
    """float32 fma(a, b, acc), correctly rounded: the float32 product is exact in float64, the
    float64 sum is made round-to-odd from its exact error (TwoSum), and rounding that to float32
    is then a single correct rounding (53 >= 24 + 2 bits)."""
    p = a.astype(np.float64) * b.astype(np.float64)
    q = acc.astype(np.float64)
    s = p + q
    bb = s - p
    err = (p - (s - bb)) + (q - bb)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(_F)


def _float_rows(w: QTensor):
    m, k = w.shape
    raw = w.rows()
    if w.qtype == T.F32:
        return raw.view(_F).reshape(m, k)
    if w.qtype == T.F16:
        return raw.view(np.float16).reshape(m, k).astype(_F)
    return (raw.view(np.uint16).reshape(m, k).astype(np.uint32) << 16).view(_F)  # BF16


def matmul_float_reference(w: QTensor, x):
    """matmul_float's order: lane l = fma over j ≡ l (mod 16), increasing j, from +0.0 (the last
    partial slice zero-padded); then s8 = a[l] + a[l+8], s4, s2 likewise, s = s2[0] + s2[1]."""
    wf = _float_rows(w)
    m, k = wf.shape
    kp = -(-k // 16) * 16
    wp = np.zeros((m, kp), _F)
    wp[:, :k] = wf
    xp = np.zeros((x.shape[0], kp), _F)
    xp[:, :k] = x
    acc = np.zeros((x.shape[0], m, 16), _F)  # [n, m, lanes]
    for j in range(0, kp, 16):
        acc = _fma32(wp[None, :, j : j + 16], xp[:, None, j : j + 16], acc)
    for half in (8, 4, 2, 1):
        acc = acc[:, :, :half] + acc[:, :, half : 2 * half]
    return acc[:, :, 0]


def matmul_reference(w: QTensor, x, qx=None):
    """y float32 [n, m] exactly as backends/cpu/matmul.matmul computes it, for any supported type.
    qx: (xq, xd, xs) to use instead of quantize_q8_32(x) (integer types only)."""
    if w.qtype in (T.F32, T.F16, T.BF16):
        return matmul_float_reference(w, x)
    xq, xd, xs = quantize_q8_32(x) if qx is None else qx
    if w.qtype in LEGACY:
        u, d, c = decode_legacy(w)
        return _legacy_epilogue(d, c, block_dots(u, xq), xd, xs, LEGACY_INT_BIAS.get(w.qtype, 0))
    _, _, family, B = KQUANTS[w.qtype]
    u, s, c = decode_kquant(w)
    return _superblock_sum(_kquant_terms(family, B, s, c, block_dots(u, xq, 16), xq, xd, xs))
