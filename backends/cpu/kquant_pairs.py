"""The K-quants' and IQ4_XS's row-pair layout: the CPU backend's copy of a 2-D weight in which rows
2p and 2p + 1 alternate superblock by superblock.

The gemv (kquant_gemv.rows_dot) reads two rows together, one superblock of each per step. From
GGUF's layout those are two streams a row apart, and this CPU's hardware prefetchers lose them
when the weights come from DRAM (Q4_K 8192 x 4096 at n = 1: 14 GB/s, 28 with software prefetch);
paired, the same reads are one ascending stream (35 GB/s; docs/kernels.md). Every superblock keeps
its bytes, so the bits are the raw rows'. Only tensors with an even number of rows are paired
(matrices, and the experts' stacked matrices of a mixture of experts).

    raw     row 2p: [sb 0][sb 1]...   row 2p + 1: [sb 0][sb 1]...
    paired  pair p: [2p sb 0][2p+1 sb 0][2p sb 1][2p+1 sb 1]...

Q4_K and Q5_K superblocks also have their 4-bit quants repacked (pack_nibbles), so the gemv takes
each 64-weight chunk of its layout as one nibble of a 64-byte load, without GGUF's lane shuffle
(kquant_unpack's packed unpackers; the copy is made anyway).
"""

from dataclasses import replace

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.quant.tensor import QTensor
from edged.quant.types import traits

# types whose pair layout repacks qs (pack_nibbles): byte offset of qs[128] in the superblock
_QS_AT = {T.Q4_K: 16, T.Q5_K: 48}


def pairs_rows(w: QTensor) -> bool:
    """Whether w can take the pair layout: a matrix, or a stack of experts' matrices [n_expert,
    rows, cols], with an even number of rows (so no pair spans two experts)."""
    return len(w.shape) in (2, 3) and w.shape[-2] % 2 == 0


def pack_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K quants uint8 [..., 128] in GGUF's order -> the pair layout's (a copy). GGUF's
    qs[64h : 64h+32] holds 32-blocks 4h (low nibbles) and 4h+1 (high), qs[64h+32 : 64h+64] blocks
    4h+2, 4h+3; packed, 32-block 4h+b fills bytes 64h+16b .. 64h+16b+15, element i in the low and
    element 16+i in the high nibble of byte i."""
    src = qs.reshape(*qs.shape[:-1], 2, 2, 2, 16)  # [..., h, A|B half, elements 0-15|16-31, i]
    lo, hi = src & 0x0F, src >> 4  # block 4h + 2·half (low) and + 1 (high)
    blocks = np.stack([lo, hi], axis=-3)  # [..., h, half, nibble, el half, i]: block 4h + 2·half + nibble
    return (blocks[..., 0, :] | (blocks[..., 1, :] << 4)).reshape(qs.shape).astype(np.uint8)


def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """pack_nibbles' inverse: quants uint8 [..., 128] in the pair layout's order -> GGUF's."""
    src = qs.reshape(*qs.shape[:-1], 2, 2, 2, 16)  # [..., h, half, nibble, i]: block 4h + 2·half + nibble
    first, second = src & 0x0F, src >> 4  # elements i and 16+i
    els = np.stack([first, second], axis=-2)  # [..., h, half, nibble, el half, i]
    return (els[..., 0, :, :] | (els[..., 1, :, :] << 4)).reshape(qs.shape).astype(np.uint8)


def _repack_in_place(rows: np.ndarray, qtype, block_bytes: int, fn) -> np.ndarray:
    """rows (a fresh uint8 [m, row_bytes] copy) with each superblock's qs passed through fn, in
    place; types without a repack are left as they are. Returns rows."""
    at = _QS_AT.get(qtype)
    if at is not None:
        sb = rows.reshape(rows.shape[0], -1, block_bytes)  # [m, superblocks, bytes]: a view
        sb[..., at:at + 128] = fn(sb[..., at:at + 128])
    return rows


def pair_rows(rows: np.ndarray, qtype) -> np.ndarray:
    """uint8 [m, row_bytes] raw rows of `qtype` (m even) -> the same superblocks in the pair layout
    (a copy; Q4_K / Q5_K quants repacked by pack_nibbles)."""
    m, rb = rows.shape
    bb = traits(qtype).type_size
    nsb = rb // bb
    # always a copy (ascontiguousarray would hand back a view of a one-superblock pair's rows)
    out = rows.reshape(m // 2, 2, nsb, bb).swapaxes(1, 2).copy().reshape(m, rb)
    return _repack_in_place(out, qtype, bb, pack_nibbles)


def unpaired_rows(rows: np.ndarray, qtype, ids: np.ndarray) -> np.ndarray:
    """Raw rows `ids` (int [n]) of a `qtype` tensor in the pair layout (uint8 [m, row_bytes]) ->
    [n, row_bytes] in GGUF's layout."""
    m, rb = rows.shape
    bb = traits(qtype).type_size
    nsb = rb // bb
    by_pair = rows.reshape(m // 2, nsb, 2, bb)  # [pair, superblock, row of the pair, bytes]
    raw = np.ascontiguousarray(by_pair[ids // 2, :, ids % 2]).reshape(len(ids), rb)  # gathered: a fresh array
    return _repack_in_place(raw, qtype, bb, unpack_nibbles)


def paired(w: QTensor) -> QTensor:
    """w (pairs_rows) as a pair-layout copy, marked grouped (the CPU's own layout)."""
    return replace(w, data=pair_rows(w.rows(), w.qtype).reshape(-1), grouped=True)
