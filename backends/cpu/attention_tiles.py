"""Register tiles of CPU attention: scores of 4 query heads x 4 keys, and V rows weighted likewise.

A tile shares each loaded K/V element across 4 query heads (16 multiply-adds per 4 key loads),
where a one-key-at-a-time loop loads once per multiply-add. score_keys and weigh_values, both
made by _key_walker, cover a run of keys within one cache block with 4x4 tiles, a 1x4 tile for
each head past a multiple of 4 and one key at a time for the last keys. Every function here is
inlined into attention.py's kernel and compiled with the same fastmath flags (FM). K/V rows are
read through kv_codec.kv_row: f16 / q8_0 rows are widened to float32 once per visit, for all heads.
"""

import numba as nb
import numpy as np

from edged.backends.cpu.kv_codec import kv_row

FM = {"reassoc", "contract", "nsz", "arcp"}  # no nnan/ninf: the -inf sentinel must stay exact


@nb.njit(inline="always", fastmath=FM)
def _dot(a, b):
    """a . b for float32 [hd] rows, vectorized (reassociated) sum."""
    s = np.float32(0.0)
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@nb.njit(inline="always", fastmath=FM)
def _fma4(s0, s1, s2, s3, b, a0, a1, a2, a3):
    """(s0 + b a0, .., s3 + b a3): one query element times the same element of four keys."""
    return s0 + b * a0, s1 + b * a1, s2 + b * a2, s3 + b * a3


@nb.njit(inline="always", fastmath=FM)
def _store4(row, jj, scale, s0, s1, s2, s3):
    """row[jj:jj+4] = (s0, .., s3) * scale."""
    row[jj] = s0 * scale
    row[jj + 1] = s1 * scale
    row[jj + 2] = s2 * scale
    row[jj + 3] = s3 * scale


@nb.njit(inline="always", fastmath=FM)
def _load4(row, jj):
    """row[jj], .., row[jj + 3] as four scalars."""
    return row[jj], row[jj + 1], row[jj + 2], row[jj + 3]


@nb.njit(inline="always", fastmath=FM)
def _scores_4x4(qg, h, k0, k1, k2, k3, sc, jj, scale):
    """sc[h:h+4, jj:jj+4] = qg[h:h+4] . [k0..k3] * scale; qg [g, hd], k rows [hd]."""
    q0 = qg[h]
    q1 = qg[h + 1]
    q2 = qg[h + 2]
    q3 = qg[h + 3]
    s00 = s01 = s02 = s03 = np.float32(0.0)
    s10 = s11 = s12 = s13 = np.float32(0.0)
    s20 = s21 = s22 = s23 = np.float32(0.0)
    s30 = s31 = s32 = s33 = np.float32(0.0)
    for d in range(q0.shape[0]):
        a0 = k0[d]
        a1 = k1[d]
        a2 = k2[d]
        a3 = k3[d]
        s00, s01, s02, s03 = _fma4(s00, s01, s02, s03, q0[d], a0, a1, a2, a3)
        s10, s11, s12, s13 = _fma4(s10, s11, s12, s13, q1[d], a0, a1, a2, a3)
        s20, s21, s22, s23 = _fma4(s20, s21, s22, s23, q2[d], a0, a1, a2, a3)
        s30, s31, s32, s33 = _fma4(s30, s31, s32, s33, q3[d], a0, a1, a2, a3)
    _store4(sc[h], jj, scale, s00, s01, s02, s03)
    _store4(sc[h + 1], jj, scale, s10, s11, s12, s13)
    _store4(sc[h + 2], jj, scale, s20, s21, s22, s23)
    _store4(sc[h + 3], jj, scale, s30, s31, s32, s33)


@nb.njit(inline="always", fastmath=FM)
def _scores_1x4(qr, k0, k1, k2, k3, sr, jj, scale):
    """sr[jj:jj+4] = qr . [k0..k3] * scale for one head's query row qr [hd]."""
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for d in range(qr.shape[0]):
        b = qr[d]
        s0 += b * k0[d]
        s1 += b * k1[d]
        s2 += b * k2[d]
        s3 += b * k3[d]
    _store4(sr, jj, scale, s0, s1, s2, s3)


@nb.njit(inline="always", fastmath=FM)
def _weigh_4x4(acc, h, v0, v1, v2, v3, sc, jj, scale):
    """acc[h:h+4] += sc[h:h+4, jj:jj+4] @ [v0..v3]; acc [g, hd], v rows [hd] (scale unused)."""
    p00, p01, p02, p03 = _load4(sc[h], jj)
    p10, p11, p12, p13 = _load4(sc[h + 1], jj)
    p20, p21, p22, p23 = _load4(sc[h + 2], jj)
    p30, p31, p32, p33 = _load4(sc[h + 3], jj)
    a0 = acc[h]
    a1 = acc[h + 1]
    a2 = acc[h + 2]
    a3 = acc[h + 3]
    for d in range(a0.shape[0]):
        x0 = v0[d]
        x1 = v1[d]
        x2 = v2[d]
        x3 = v3[d]
        a0[d] += p00 * x0 + p01 * x1 + p02 * x2 + p03 * x3
        a1[d] += p10 * x0 + p11 * x1 + p12 * x2 + p13 * x3
        a2[d] += p20 * x0 + p21 * x1 + p22 * x2 + p23 * x3
        a3[d] += p30 * x0 + p31 * x1 + p32 * x2 + p33 * x3


@nb.njit(inline="always", fastmath=FM)
def _weigh_1x4(ar, v0, v1, v2, v3, sr, jj, scale):
    """ar += sr[jj:jj+4] @ [v0..v3] for one head's accumulator row ar [hd] (scale unused)."""
    p0, p1, p2, p3 = _load4(sr, jj)
    for d in range(ar.shape[0]):
        ar[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d]


@nb.njit(inline="always", fastmath=FM)
def _scores_1(qg, krow, sc, jj, scale):
    """sc[:, jj] = qg . krow * scale for one key row krow [hd]."""
    for h in range(qg.shape[0]):
        sc[h, jj] = _dot(qg[h], krow) * scale


@nb.njit(inline="always", fastmath=FM)
def _weigh_1(acc, vrow, sc, jj, scale):
    """acc[h] += sc[h, jj] * vrow for every head h, one V row vrow [hd] (scale unused)."""
    for h in range(acc.shape[0]):
        y = acc[h]
        a = sc[h, jj]
        for i in range(y.shape[0]):
            y[i] += a * vrow[i]


def _key_walker(tile4x4, tile1x4, tile1):
    """A kernel helper f(rows [g, hd], cache [nb, bs, kvh, hd], scales, blk, kh, o0, o1, sc, base,
    scale, buf) visiting keys o0..o1-1 of cache block blk, kv head kh: 4 keys at a time, as 4x4
    tiles of heads and a 1x4 tile for each head past a multiple of 4, then one key at a time; the
    key at offset o uses column base + o of sc [g, nk]. scales: q8_0's [nb, bs, kvh, hd / 32];
    buf float32 [5, hd]: the widened rows of an f16 / q8_0 cache (kv_codec.kv_row)."""

    @nb.njit(inline="always", fastmath=FM)
    def walk(rows, cache, scales, blk, kh, o0, o1, sc, base, scale, buf):
        g = rows.shape[0]
        o = o0
        while o + 4 <= o1:
            c0 = kv_row(cache, scales, blk, o, kh, buf, 0)
            c1 = kv_row(cache, scales, blk, o + 1, kh, buf, 1)
            c2 = kv_row(cache, scales, blk, o + 2, kh, buf, 2)
            c3 = kv_row(cache, scales, blk, o + 3, kh, buf, 3)
            h = 0
            while h + 4 <= g:
                tile4x4(rows, h, c0, c1, c2, c3, sc, base + o, scale)
                h += 4
            while h < g:
                tile1x4(rows[h], c0, c1, c2, c3, sc[h], base + o, scale)
                h += 1
            o += 4
        while o < o1:
            tile1(rows, kv_row(cache, scales, blk, o, kh, buf, 0), sc, base + o, scale)
            o += 1

    return walk


# score_keys(qg, kc, ...): scores of query heads qg [g, hd] against the keys into sc
score_keys = _key_walker(_scores_4x4, _scores_1x4, _scores_1)
# weigh_values(acc, vc, ..., scale=unused): acc [g, hd] += probabilities sc times the V rows
weigh_values = _key_walker(_weigh_4x4, _weigh_1x4, _weigh_1)
