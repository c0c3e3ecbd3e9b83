"""moe_matmul: every chosen expert's matmul of a mixture-of-experts layer in one call (llama.cpp's
mul_mat_id).

The (token, expert) pairs come grouped by expert; group g's pairs cuts[g]:cuts[g+1] multiply
expert experts[g]'s slab of the stacked 3-D tensor. At decode a layer has k groups of one row,
where one matmul per expert and weight paid a Python call, a quantization of the same x and a
thread-pool start each; here x is quantized once and all small groups of up to two weights (gate
and up) run in one parallel kernel over (weight, group, rows): built on kquant_gemv.rows_dot for
the K-quants and IQ4_XS, on lowbit_rows.rows_dot for IQ1_S, IQ1_M, TQ1_0, TQ2_0 and MXFP4 (gpt-oss's
experts), on legacy_gemv.rows_dot8 for Q4_0 .. Q8_0 and IQ4_NL (one compiled kernel per type, as
their gemv). Groups larger than matmul's gemv threshold, and other types, go through
matmul per group with the shared quantization. Either way each output row is the one
matmul of that expert gives it (the gemv's float order is the gemm's): bit-identical, so batch
invariance holds.
"""

import numba as nb
import numpy as np

from edged.backends.cpu.act_quant import quantize_activations
from edged.backends.cpu.aligned import empty_aligned
from edged.backends.cpu.kquant_gemv import GEMV_TOKENS, rows_dot
from edged.backends.cpu.legacy_gemv import repack_groups8, rows_dot8
from edged.backends.cpu import lowbit_rows
from edged.backends.cpu.matmul import gemv_max_n, matmul, takes_q8
from edged.backends.cpu.matmul_kquants import GEMV_ROWS, QK_K, gemv_operands, kind_of, row_start
from edged.backends.cpu.matmul_legacy import KIND as LEGACY_KINDS
from edged.backends.cpu.matmul_lowbit import KINDS as LOWBIT_KINDS, _split_row
from edged.backends.cpu.matmul_lowbit import gemv_operands as lowbit_operands
from edged.quant.tensor import QTensor



@nb.njit(cache=True, nogil=True)
def _prepare(xq, xd, xs, rows, kind):
    """The gemv's activation operands of x's rows `rows` (int32 [P], in pair order): x int8 [P, k]
    (the per-32 types' interleaved layout), xa, xb float32 [P, nf], as gemv_kquant makes them."""
    return gemv_operands(xq[rows], xd[rows], xs[rows], kind)  # gather first: every step is per row


# bytes ahead that the experts kernels prefetch: expert slabs are read cold, a token's worth at a
# time, and matmul's tuned prefetch knob does not reach these (group, rows) tasks. K-quants: Q4_K
# 2 x 1024 x 1024 gate/up at decode 334 -> 239 us at 2,048-3,072 bytes (Intel Xeon, docs/BENCHMARKS.md);
# legacy: 1.18x decode on a Q8_0-expert MoE (AMD Zen 4)
KQUANT_EXPERT_PREFETCH = 2048
EXPERT_PREFETCH = 4096


@nb.njit(cache=True, nogil=True, inline="always")
def _task_of(it, ng, ntask):
    """(weight, group, row task) of prange step `it` of the experts kernels."""
    return it // (ng * ntask), (it // ntask) % ng, it % ntask


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)
def _experts_gemv(w0, w1, nw, m, x, xa, xb, experts, cuts, small, y0, y1, kind, lowbit, nsb, tail, paired0, paired1):
    """y_j[p] = x[p] @ W_j[experts[g]].T for j < nw and the pairs p in cuts[g]:cuts[g+1] of each
    group g with small[g]; w_j uint8 [n_expert * m, row_bytes] (the experts' rows stacked, each nsb
    superblocks and `tail` bytes; with paired_j in kquant_pairs' pair layout), y_j float32 [P, m].
    One task per (weight, group, GEMV_ROWS rows); the row loop is gemv_kquant's, or with `lowbit`
    gemv_lowbit's (kind: that module's)."""
    rb = w0.shape[1]
    sbb = rb // max(nsb, 1)  # bytes per superblock (K-quants: rows hold whole superblocks)
    k = x.shape[1]
    nf = xa.shape[1]
    ng = experts.shape[0]
    ntask = (m + GEMV_ROWS - 1) // GEMV_ROWS
    for it in nb.prange(nw * ng * ntask):
        j, g, task = _task_of(it, ng, ntask)
        if not small[g]:
            continue
        w, y, paired = (w0, y0, paired0) if j == 0 else (w1, y1, paired1)
        base, a, b = experts[g] * m, cuts[g], cuts[g + 1]
        for r in range(task * GEMV_ROWS, min(m, (task + 1) * GEMV_ROWS), 2):
            r1 = min(r + 1, m - 1)  # an odd last row is computed twice into the same place
            t = a
            while t < b:
                nt = GEMV_TOKENS if b - t >= GEMV_TOKENS else (2 if b - t >= 2 else 1)
                o0, o1 = t * m + r, t * m + r1
                if lowbit:
                    lowbit_rows.rows_dot(kind, nt, w, (base + r) * rb, (base + r1) * rb, x, t * k, k, xa, xb, t * nf,
                                         nf, nsb, tail, y, o0, o1, m)
                else:  # m is even where paired: an expert's pairs are its own
                    off0, sbs = row_start(base + r, rb, sbb, paired)
                    off1, _ = row_start(base + r1, rb, sbb, paired)
                    rows_dot(kind, nt, w, off0, off1, x, t * k, k, xa, xb, t * nf, nf, nsb, y, o0, o1, m,
                             KQUANT_EXPERT_PREFETCH, sbs)
                t += nt


@nb.njit(cache=True, nogil=True)
def _prepare_lowbit(xq, xd, xs, rows, kind, units):
    """_prepare for the low-bit types (lowbit_rows.rows_dot's operands, x padded to `units` superblocks)."""
    return lowbit_operands(xq[rows], xd[rows], xs[rows], kind, units)


@nb.njit(cache=True, nogil=True)
def _prepare_legacy(xq, xd, xs, rows, cuts, small):
    """rows_dot8's operands of each small group: x's rows in pair order (xg int8 [P, k], xdg
    float32 and xsg int32 [P, k/32]), and xt int8 [token pairs, ceil(k/256) · 512] with group g's
    pairs repacked (repack_groups8) at xt[poff[g] : poff[g+1]]; poff int64 [g+1]."""
    xg, xdg, xsg = xq[rows], xd[rows], xs[rows]
    ng = cuts.shape[0] - 1
    poff = np.zeros(ng + 1, np.int64)
    for g in range(ng):
        poff[g + 1] = poff[g] + ((cuts[g + 1] - cuts[g] + 1) // 2 if small[g] else 0)
    k = xq.shape[1]
    xt = empty_aligned(max(1, poff[ng]), ((k // 32 + 7) // 8) * 512, np.int8)  # [pairs, groups · 512]
    for g in range(ng):
        if small[g]:
            repack_groups8(xg[cuts[g]:cuts[g + 1]], xt[poff[g]:poff[g + 1]])
    return xg, xdg, xsg, xt, poff


def _make_experts_gemv_legacy(qtype):
    """_experts_gemv's counterpart for one legacy type over rows_dot8, whose block layout is a
    compile-time constant (so each type compiles its own, named for it in the cache)."""
    kind = LEGACY_KINDS[qtype]

    def kernel(w0, w1, nw, m, xg, xd, xs, xt, poff, experts, cuts, small, y0, y1):
        ng = experts.shape[0]
        ntask = (m + GEMV_ROWS - 1) // GEMV_ROWS
        for it in nb.prange(nw * ng * ntask):
            j, g, task = _task_of(it, ng, ntask)
            if not small[g]:
                continue
            a, b = cuts[g], cuts[g + 1]
            w = w0 if j == 0 else w1
            y = (y0 if j == 0 else y1)[a:b]  # [group pairs, m]
            xt_g = xt[poff[g]:poff[g + 1]]
            acc = empty_aligned(1, 8 * (b - a), np.float32)[0]  # [pairs, 8] lane accumulators
            for r in range(task * GEMV_ROWS, min(m, (task + 1) * GEMV_ROWS)):
                rows_dot8(w[experts[g] * m + r], kind, xt_g, xg[a:b], xd[a:b], xs[a:b], acc, y, r, EXPERT_PREFETCH, 0)

    name = f"experts_gemv_{qtype.name.lower()}"
    kernel.__name__ = kernel.__qualname__ = name
    return nb.njit(cache=True, nogil=True, parallel=True, fastmath=False)(kernel)


_EXPERTS_LEGACY = {qtype: _make_experts_gemv_legacy(qtype) for qtype in LEGACY_KINDS}


@nb.njit(cache=True, nogil=True)
def _small_groups(rows, experts, cuts, n_rows, n_expert, max_n):
    """(error, small uint8 [g], n_small): small[g] when group g has 1..max_n pairs; error 1 when cuts do
    not rise from 0 to len(rows), 2 for an expert id outside [0, n_expert), 3 for a row outside
    [0, n_rows) (the kernels index with them: checked before any runs)."""
    ng = experts.shape[0]
    small = np.zeros(ng, np.uint8)
    if cuts.shape[0] != ng + 1 or cuts[0] != 0 or cuts[ng] != rows.shape[0]:
        return 1, small, 0
    n_small = 0
    for g in range(ng):
        size = cuts[g + 1] - cuts[g]
        if size < 0:
            return 1, small, 0
        if experts[g] < 0 or experts[g] >= n_expert:
            return 2, small, 0
        if 0 < size <= max_n:
            small[g] = 1
            n_small += 1
    for r in rows:
        if r < 0 or r >= n_rows:
            return 3, small, 0
    return 0, small, n_small


def _check_weights(ws, x):
    if not ws or len(ws) > 2:
        raise ValueError(f"moe_matmul takes one or two stacked weights, got {len(ws)}")
    w = ws[0]
    for v in ws:
        if not isinstance(v, QTensor) or len(v.shape) != 3:
            raise ValueError(f"moe_matmul weight {getattr(v, 'name', v)!r} must be a 3-D [n_expert, m, k] QTensor")
        if v.shape != w.shape:
            raise ValueError(f"moe_matmul weights {w.name!r} {w.shape} and {v.name!r} {v.shape} differ in shape")
    k = w.shape[2]
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"moe_matmul {w.name!r} {w.shape} needs float32 x of shape [n, {k}], got {x.dtype} {x.shape}")


_GROUP_ERRORS = {1: "cuts must rise from 0 to the number of rows, one more than the groups",
                 2: "expert ids must be in [0, {e})", 3: "rows must be in [0, {n})"}


def moe_matmul(ws, x: np.ndarray, rows: np.ndarray, experts: np.ndarray, cuts: np.ndarray) -> list:
    """[y_j float32 [P, m] for each w_j in ws] with y_j[p] = x[rows[p]] @ W_j[experts[g]].T for
    cuts[g] <= p < cuts[g+1]: ws one or two stacked QTensors [n_expert, m, k] of one shape (gate
    and up share x's quantization), x float32 [n, k], rows int [P], experts int [g], cuts int [g+1]."""
    x = np.ascontiguousarray(x)
    rows = np.ascontiguousarray(rows, dtype=np.int32)
    experts = np.ascontiguousarray(experts, dtype=np.int64)
    cuts = np.ascontiguousarray(cuts, dtype=np.int64)
    _check_weights(ws, x)
    n_expert, m, _ = ws[0].shape
    qtype = ws[0].qtype
    kind = kind_of(ws[0])  # one kind for both weights: a raw and a paired stack run apart
    fused = (kind is not None or qtype in _EXPERTS_LEGACY or qtype in LOWBIT_KINDS) and all(
        w.qtype == qtype and kind_of(w) == kind for w in ws)
    err, small, n_small = _small_groups(rows, experts, cuts, x.shape[0], n_expert, gemv_max_n(qtype) if fused else 0)
    if err:
        raise ValueError("moe_matmul: " + _GROUP_ERRORS[err].format(e=n_expert, n=x.shape[0]))
    P = rows.shape[0]
    ys = [np.empty((P, m), dtype=np.float32) for _ in ws]  # [P, m] each
    if P == 0:
        return ys
    q8 = [takes_q8(w.qtype) for w in ws]  # unknown types: matmul names them
    qx = quantize_activations(x) if any(q8) else None  # once for every expert and weight
    if n_small and qtype in LOWBIT_KINDS:
        lk = LOWBIT_KINDS[qtype]
        nsb, tail = _split_row(lk, ws[0].rows().shape[1])
        xg, xa, xb = _prepare_lowbit(*qx, rows, lk, nsb + (1 if tail else 0))
        _experts_gemv(ws[0].rows(), ws[-1].rows(), len(ws), m, xg, xa, xb, experts, cuts, small, ys[0], ys[-1],
                      lk, True, nsb, tail, 0, 0)
    elif n_small and kind is None:
        xg, xd, xs, xt, poff = _prepare_legacy(*qx, rows, cuts, small)
        _EXPERTS_LEGACY[qtype](ws[0].rows(), ws[-1].rows(), len(ws), m, xg, xd, xs, xt, poff, experts, cuts, small,
                               ys[0], ys[-1])
    elif n_small:
        xg, xa, xb = _prepare(*qx, rows, kind)
        _experts_gemv(ws[0].rows(), ws[-1].rows(), len(ws), m, xg, xa, xb, experts, cuts, small, ys[0], ys[-1],
                      kind, False, x.shape[1] // QK_K, 0, ws[0].grouped, ws[-1].grouped)
    for g in (np.flatnonzero(small == 0) if n_small < len(small) else ()):  # large groups, other types: matmul each
        a, b, e = int(cuts[g]), int(cuts[g + 1]), int(experts[g])
        if a == b:
            continue
        r = rows[a:b]
        xr = x[r]  # [b - a, k]
        gq = None if qx is None else (qx[0][r], qx[1][r], qx[2][r])
        for w, y, wq in zip(ws, ys, q8):
            matmul(w.slab(e), xr, qx=gq if wq else None, out=y[a:b])
    return ys
