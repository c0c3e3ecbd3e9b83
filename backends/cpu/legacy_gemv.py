"""The legacy types' gemv: one raw weight row · every token of a small batch (rows_dot8).

Each group of 8 blocks is decoded once for all tokens and transposed in registers (vector g holds
4-byte group g of the 8 blocks), and the activations are repacked the same way once per call
(repack_groups8), so one vpdpbusd per group sums 8 whole blocks into 8 int32 lanes: no horizontal
sum per block or per token. On VNNI hosts two tokens share each 512-bit vpdpbusd, and a last
group of <= 4 blocks (k = 640, 896, ...) packs a token pair into each 256-bit vector. Block terms
are added in legacy_blocks' canonical 8-lane order, bit-identical to the gemm tile.
"""

import numba as nb
import numpy as np
from numba.core import types
from numba.extending import intrinsic

from edged.backends.cpu.legacy_blocks import ALL_KINDS, GROUPED_KINDS, kind_layout
from edged.backends.cpu.legacy_gemv_ir import GemvRowEmitter
from edged.backends.cpu.legacy_gemv_rows_ir import GemvRowsEmitter
from edged.backends.cpu.legacy_groups import whole_groups


def _arr(t, dtype, ndim):
    return isinstance(t, types.Array) and t.dtype == dtype and t.ndim == ndim


def _typed_rows_dot8(row, kind, xt, xq, xd, xs, acc, y, r, *knobs):
    """(signature, codegen) of the row dot for these argument types, or None if they do not fit."""
    ok = (
        _arr(row, types.uint8, 1) and isinstance(kind, types.IntegerLiteral) and kind.literal_value in ALL_KINDS
        and _arr(xt, types.int8, 2) and _arr(xq, types.int8, 2) and _arr(xd, types.float32, 2)
        and _arr(xs, types.int32, 2) and _arr(acc, types.float32, 1) and _arr(y, types.float32, 2)
        and isinstance(r, types.Integer) and all(isinstance(t, types.Integer) for t in knobs)
    )
    if not ok:
        return None
    layout, grouped = kind_layout(kind.literal_value)
    sig = types.void(row, kind, xt, xq, xd, xs, acc, y, r, *knobs)

    def codegen(context, builder, signature, args):
        GemvRowEmitter(context, builder, signature, args, layout, grouped).emit()
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _rows_dot8(typingctx, row, kind, xt, xq, xd, xs, acc, y, r):
    """y[t, r] = Σ_j w_j·x_tj for every token t, canonical 8-lane float order (see rows_dot8), with
    the default knobs (no prefetch; token pairs on VNNI hosts)."""
    return _typed_rows_dot8(row, kind, xt, xq, xd, xs, acc, y, r)


@intrinsic
def _rows_dot8_knobs(typingctx, row, kind, xt, xq, xd, xs, acc, y, r, pf, mode):
    """_rows_dot8 with rows_dot8's run-time knobs pf and mode."""
    return _typed_rows_dot8(row, kind, xt, xq, xd, xs, acc, y, r, pf, mode)


@nb.njit(cache=True, nogil=True, inline="always")
def rows_dot8(row, kind, xt, xq, xd, xs, acc, y, r, pf, mode):
    """Column r of y [n, m] for one weight row of kind_layout(kind)'s blocks, raw or grouped
    (legacy_groups.py; kind a compile-time constant) and all n tokens, in the canonical 8-lane float order (bit-identical to
    row_tile_dot_raw8's lane for the same token).

    xt int8 [ceil(n/2), ceil(k/256)·512]: xq repacked by repack_groups8; xq int8 [n, k] (its shape only);
    xd float32 [n, k/32]; xs int32 [n, k/32]; acc float32 scratch [>= 8n]. Sizes are not checked:
    the caller guarantees them. Run-time knobs that leave every lane's arithmetic as it is:
    pf > 0 prefetches the bytes pf ahead of each group of the row (0: none); mode 1 runs one token
    per 256-bit dot where VNNI hosts pair two tokens in a 512-bit one (0)."""
    _rows_dot8_knobs(row, kind, xt, xq, xd, xs, acc, y, r, pf, mode)


@intrinsic
def _rows_dot8_one(typingctx, w, kind, xt, xd, xs, y, r0, r1, pf):
    """rows_dot8_one's IR (legacy_gemv_rows_ir); for a raw kind an empty body (one_token_rows is
    false there, so the call is never reached)."""
    ok = (
        _arr(w, types.uint8, 2) and isinstance(kind, types.IntegerLiteral) and kind.literal_value in ALL_KINDS
        and _arr(xt, types.int8, 2) and _arr(xd, types.float32, 2)
        and _arr(xs, types.int32, 2) and _arr(y, types.float32, 2) and isinstance(r0, types.Integer)
        and isinstance(r1, types.Integer) and isinstance(pf, types.Integer)
    )
    if not ok:
        return None
    layout, grouped = kind_layout(kind.literal_value)

    def codegen(context, builder, signature, args):
        if grouped:
            GemvRowsEmitter(context, builder, signature, args, layout).emit()
        return context.get_dummy_value()

    return types.void(w, kind, xt, xd, xs, y, r0, r1, pf), codegen


@nb.njit(cache=True, nogil=True, inline="always")
def one_token_rows(kind, nblk):
    """Whether rows_dot8_one serves rows of this kind and nblk blocks: grouped rows of whole
    groups of 8 and at most a last group of 4 (no raw tail)."""
    return kind >= GROUPED_KINDS and whole_groups(nblk)


@nb.njit(cache=True, nogil=True, inline="always")
def rows_dot8_one(w, kind, xt, xd, xs, y, r0, r1, pf):
    """y[0, r0 : r1] for one token: rows_dot8's values bit for bit (its lanes' float operations
    in its order), for rows where one_token_rows holds, in one loop with the lanes in registers.
    w uint8 [m, row_bytes] C-contiguous, 0 <= r0 <= r1 <= m (not checked); xt, xd, xs as rows_dot8
    takes them for n = 1; pf as rows_dot8's."""
    _rows_dot8_one(w, kind, xt, xd, xs, y, r0, r1, pf)


@nb.njit(cache=True, nogil=True)
def repack_groups8(xq, xt):
    """Activations in rows_dot8's order: for each group G of 8 blocks, 4-byte group g of the 8
    blocks side by side (the transposed weights' lanes), tokens in pairs:
        xt[t // 2, 512G + 64g + 32(t % 2) + 4j + q] = xq[t, 32(8G + j) + 4g + q],
    except a last group of at most 4 blocks, which packs the pair into one 32-byte vector:
        xt[t // 2, 512G + 64g + 16(t % 2) + 4j + q] (j < 4).
    Everything else (blocks past the row's end, an odd last token's partner) is zero.
    xt int8 [ceil(n/2), ceil(k/256) · 512]."""
    n, k = xq.shape
    nblk = k // 32
    ngroup = xt.shape[1] // 512
    xq4 = xq.view(np.int32)  # [n, k/4]: whole 4-byte groups move
    xt4 = xt.view(np.int32)  # [ceil(n/2), ngroup · 128]
    xt[:] = 0
    for t in range(n):
        p = t // 2
        for grp in range(ngroup):
            nb_here = min(8, nblk - grp * 8)
            h = (t % 2) * (4 if nb_here <= 4 else 8)
            for j in range(nb_here):
                b = grp * 8 + j
                for g in range(8):
                    xt4[p, grp * 128 + g * 16 + h + j] = xq4[t, b * 8 + g]
