"""edged's grouped layout of the 32-element block types: each run of 8 blocks stored already
transposed, so the gemv's decode needs no per-block shuffles and no 8x8 transpose.

A row's blocks are cut into groups of 8 (the gemv's unit, legacy_gemv.rows_dot8), and a last
group of exactly 4 (k = 640, 896, 1152, ...); within a group of nb blocks the fields of every
block sit side by side, in this order:
    d      nb fp16 scales                          (2·nb bytes)
    m      nb fp16 mins (Q4_1, Q5_1)               (2·nb bytes)
    H      8 words of 4·nb bits (Q5_0, Q5_1): bit 4j+q of word g = the fifth bit of element
           4g+q of block j                          (4·nb bytes)
    Q      nibble types: 4 vectors of 4·nb bytes, byte 4j+q of vector g = quant byte 4g+q of
           block j (its low nibble is element 4g+q, its high one element 16+4g+q);
           Q8_0: 8 vectors, byte 4j+q of vector g = (int8 element 4g+q of block j) ^ 0x80.
So a group of nb blocks takes nb raw blocks' bytes, at the same row offset, and a row keeps its
size. Blocks after the last whole group (a last group of neither 8 nor 4) stay in GGUF's layout.
The integers each block contributes are the raw layout's, so kernels give the same bits.
"""

import numba as nb
import numpy as np
from llvmlite import ir

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.legacy_blocks import LAYOUTS, bits_mask, f16_at
from edged.backends.cpu.vector_ir import I8, I32

GROUP = 8  # blocks per full group
TAIL = 4  # the one partial group size stored grouped


@nb.njit(nogil=True, cache=True)
def _offsets(nb, hoff, moff):
    """(m, H, Q) byte offsets in a group of nb blocks (-1 where the type has no such field)."""
    pos = 2 * nb
    mpos = pos if moff >= 0 else -1
    pos += 2 * nb if moff >= 0 else 0
    hpos = pos if hoff >= 0 else -1
    pos += 4 * nb if hoff >= 0 else 0
    return mpos, hpos, pos


def field_offsets(layout, nb):
    """_offsets for a LAYOUTS entry."""
    return _offsets.py_func(nb, layout[2], layout[3])


@nb.njit(nogil=True, cache=True)
def _group_into(rows, out, size, qoff, hoff, moff, nib):
    """out[r] = rows[r] grouped (see the module's docstring); out starts as a copy of rows, so a
    raw tail is already in place. Serial: start-up code must leave no OpenMP team behind."""
    m, rb = rows.shape
    nfull, rem = divmod(rb // size, GROUP)
    for r in range(m):
        for grp in range(nfull + (1 if rem == TAIL else 0)):
            nbk = GROUP if grp < nfull else TAIL
            base = grp * GROUP * size
            mpos, hpos, qpos = _offsets(nbk, hoff, moff)
            for j in range(nbk):
                src = base + j * size
                for i in range(2):
                    out[r, base + 2 * j + i] = rows[r, src + i]
                    if moff >= 0:
                        out[r, base + mpos + 2 * j + i] = rows[r, src + moff + i]
                for g in range(4 if nib else 8):
                    for q in range(4):
                        v = rows[r, src + qoff + 4 * g + q]
                        out[r, base + qpos + 4 * nbk * g + 4 * j + q] = v if nib else v ^ np.uint8(0x80)
            if hoff >= 0:
                for g in range(8):
                    word = 0
                    for j in range(nbk):
                        p = base + j * size + hoff
                        qh = rows[r, p] | (rows[r, p + 1] << 8) | (rows[r, p + 2] << 16) | (np.int64(rows[r, p + 3]) << 24)
                        word |= ((qh >> (4 * g)) & 0xF) << (4 * j)
                    for i in range(nbk // 2):
                        out[r, base + hpos + (nbk // 2) * g + i] = (word >> (8 * i)) & 0xFF


def _ungroup_blocks(grp, layout, nb):
    """The inverse of _group_into for groups of nb blocks: [..., nb · size] -> raw blocks [..., nb, size]."""
    size, qoff, hoff, moff, nib, _, _ = layout
    lead = grp.shape[:-1]
    mpos, hpos, qpos = field_offsets(layout, nb)
    blk = np.zeros((*lead, nb, size), np.uint8)
    blk[..., 0:2] = grp[..., 0:2 * nb].reshape(*lead, nb, 2)
    if moff >= 0:
        blk[..., moff:moff + 2] = grp[..., mpos:mpos + 2 * nb].reshape(*lead, nb, 2)
    if hoff >= 0:
        bits = np.unpackbits(grp[..., hpos:hpos + 4 * nb].reshape(*lead, 8, nb // 2), axis=-1, bitorder="little")
        bits = bits.reshape(*lead, 8, nb, 4).swapaxes(-3, -2).reshape(*lead, nb, 32)  # [..., j, element]
        blk[..., hoff:hoff + 4] = np.packbits(bits, axis=-1, bitorder="little")
    if nib:
        blk[..., qoff:qoff + 16] = grp[..., qpos:qpos + 16 * nb].reshape(*lead, 4, nb, 4).swapaxes(-3, -2).reshape(*lead, nb, 16)
    else:
        q = grp[..., qpos:qpos + 32 * nb].reshape(*lead, 8, nb, 4).swapaxes(-3, -2) ^ np.uint8(0x80)
        blk[..., qoff:qoff + 32] = q.reshape(*lead, nb, 32)
    return blk


def group_rows(rows: np.ndarray, kind: int) -> np.ndarray:
    """uint8 [m, row_bytes] rows of raw LAYOUTS[kind] blocks -> the same rows grouped (a copy)."""
    size, qoff, hoff, moff, nib, _, _ = LAYOUTS[kind]
    out = np.array(rows, dtype=np.uint8, copy=True)  # [m, row_bytes]
    _group_into(np.ascontiguousarray(rows), out, size, qoff, hoff, moff, nib)
    return out


def ungroup_rows(rows: np.ndarray, kind: int) -> np.ndarray:
    """Grouped rows of LAYOUTS[kind] -> GGUF's raw layout (a copy; numpy: embedding lookups and
    tests ungroup a few rows)."""
    layout = LAYOUTS[kind]
    size = layout[0]
    m, rb = rows.shape
    nfull, rem = divmod(rb // size, GROUP)
    out = np.array(rows, dtype=np.uint8, copy=True)  # [m, row_bytes]; a raw tail stays as it is
    spans = [(0, nfull, GROUP)] + ([(nfull * GROUP, 1, TAIL)] if rem == TAIL else [])
    for b0, ngroups, nb in spans:
        lo, hi = b0 * size, (b0 + ngroups * nb) * size
        grp = rows[:, lo:hi].reshape(m, ngroups, nb * size)
        out[:, lo:hi] = _ungroup_blocks(grp, layout, nb).reshape(m, hi - lo)
    return out


@nb.njit(nogil=True, cache=True, inline="always")
def whole_groups(nblk):
    """Whether a row of nblk blocks is grouped whole: groups of 8 and at most a last group of 4,
    no raw tail (the kernels that read only grouped words ask this)."""
    return nblk % GROUP == 0 or nblk % GROUP == TAIL


# ------------------------------------------------------------------ decode in registers


def group_words(builder, gp, layout, nb):
    """The 8 vectors <nb x i32> of one grouped group at i8* gp: vector g, lane j = the unsigned
    bytes of elements 4g..4g+3 of block j (legacy_blocks.block_u8's bytes, transposed)."""
    _, _, hoff, _, nib, _, book = layout
    _, hpos, qpos = field_offsets(layout, nb)
    vb = ir.VectorType(I8, 4 * nb)
    vw = ir.VectorType(I32, nb)

    def at(off):
        return builder.load(builder.bitcast(builder.gep(gp, [ir.Constant(I32, off)]), vb.as_pointer()), align=1)

    if not nib:
        return [builder.bitcast(at(qpos + 4 * nb * g), vw) for g in range(8)]
    words = [None] * 8
    for g in range(4):
        q = at(qpos + 4 * nb * g)
        words[g] = builder.and_(q, ir.Constant(vb, [15] * (4 * nb)))
        words[g + 4] = builder.lshr(q, ir.Constant(vb, [4] * (4 * nb)))
    for g in range(8):
        u = words[g]
        if hoff >= 0:
            hit = bits_mask(builder, builder.gep(gp, [ir.Constant(I32, hpos + (nb // 2) * g)]), 4 * nb)
            u = builder.or_(u, builder.select(hit, ir.Constant(vb, [16] * (4 * nb)), ir.Constant(vb, None)))
        if book is not None:
            u = vir.iq4_lookup(builder, u)
        words[g] = builder.bitcast(u, vw)
    return words


def group_scales(builder, gp, layout, nb):
    """(d, c) <nb x float> of one grouped group: c the fp16 mins, or d · the fixed offset."""
    _, _, _, moff, _, cfix, _ = layout
    mpos, _, _ = field_offsets(layout, nb)
    vh, vf = ir.VectorType(ir.HalfType(), nb), ir.VectorType(ir.FloatType(), nb)

    def halves(off):
        p = builder.bitcast(builder.gep(gp, [ir.Constant(I32, off)]), vh.as_pointer())
        return builder.fpext(builder.load(p, align=1), vf)

    d = halves(0)
    c = halves(mpos) if moff >= 0 else builder.fmul(d, ir.Constant(vf, [cfix] * nb))
    return d, c


def block_scale_bias_at(builder, gp, layout, nb, j):
    """(d, c) floats of block j of a grouped group at i8* gp (legacy_blocks.block_scale_bias's)."""
    _, _, _, moff, _, cfix, _ = layout
    mpos, _, _ = field_offsets(layout, nb)
    d = f16_at(builder, gp, 2 * j)
    c = f16_at(builder, gp, mpos + 2 * j) if moff >= 0 else builder.fmul(d, ir.Constant(ir.FloatType(), cfix))
    return d, c
