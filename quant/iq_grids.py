"""Lookup tables and block geometry of the low-bit GGUF types (IQ1/IQ2/IQ3, TQ, MXFP4).

The grids are llama.cpp's iq*_grid tables (ggml-common.h): each row is one codebook entry of 8 (IQ2, IQ1)
or 4 (IQ3) weight magnitudes. They are decoded once at import from the packed hex strings gguf-py ships
(gguf.quants.<TYPE>.grid_hex: each byte holds 4 or 2 level indices of 2 or 3 bits, low bits first, into the
type's grid_map of levels), not retyped. Numba kernels close over these module-level numpy arrays.
"""

from math import ceil, log2

import numpy as np
from gguf import quants as _gq

QK_K = 256  # elements per super-block (every type here but MXFP4)
QK_MXFP4 = 32

# bytes per block (elements per block: QK_K, MXFP4: QK_MXFP4)
IQ2_XXS_BYTES = 66  # d fp16 | qs 64 (8 x 2 uint32: 4 grid bytes; 4 x 7-bit sign index + 4-bit scale)
IQ2_XS_BYTES = 74  # d fp16 | qs 32 uint16 (9-bit grid index, 7-bit sign index) | scales 8
IQ2_S_BYTES = 82  # d fp16 | qs 32 | signs 32 | qh 8 | scales 8
IQ3_XXS_BYTES = 98  # d fp16 | qs 64 | scales_and_signs 8 uint32
IQ3_S_BYTES = 110  # d fp16 | qs 64 | qh 8 | signs 32 | scales 4
IQ1_S_BYTES = 50  # d fp16 | qs 32 | qh 8 uint16
IQ1_M_BYTES = 56  # qs 32 | qh 16 | scales 8 (the fp16 d spread over their top nibbles)
TQ1_0_BYTES = 54  # qs 48 (5 trits a byte) | qh 4 (4 trits a byte) | d fp16
TQ2_0_BYTES = 66  # qs 64 (4 x 2-bit a byte) | d fp16
MXFP4_BYTES = 17  # e E8M0 | qs 16 (4-bit E2M1 indices)

IQ1S_DELTA = 0.125  # IQ1_S / IQ1_M shift each ternary grid value by +-delta


def _decode_grid(cls) -> np.ndarray:
    """gguf-py's packed hex grid of `cls` -> float32 [entries, width] of its grid_map levels."""
    hex_digits = np.frombuffer(cls.grid_hex, dtype=np.uint8) | 0x20  # ASCII, lower-cased
    # '0'-'9' -> 0-9, 'a'-'f' -> 10-15
    nibbles = np.where(hex_digits >= ord("a"), hex_digits - ord("a") + 10, hex_digits - ord("0")).astype(np.uint8)
    packed = (nibbles[0::2] << 4) | nibbles[1::2]  # [n_bytes]
    bits = ceil(log2(len(cls.grid_map)))  # 2 (three levels) or 3 (eight levels)
    per_byte = 8 // bits  # 4 indices in 2-bit fields, or 2 in the two nibbles
    shifts = np.arange(per_byte, dtype=np.uint8) * (8 // per_byte)
    idx = (packed[:, None] >> shifts[None, :]) & ((1 << bits) - 1)  # [n_bytes, per_byte], low bits first
    levels = np.asarray(cls.grid_map, dtype=np.float32)
    grid = levels[idx.reshape(-1)].reshape(cls.grid_shape)
    return grid


def _as(grid: np.ndarray, dtype) -> np.ndarray:
    out = grid.astype(dtype)
    assert np.array_equal(out.astype(np.float32), grid), "grid levels must be integers of the target dtype"
    return np.ascontiguousarray(out)


IQ2XXS_GRID = _as(_decode_grid(_gq.IQ2_XXS), np.uint8)  # [256, 8] in {8, 25, 43}
IQ2XS_GRID = _as(_decode_grid(_gq.IQ2_XS), np.uint8)  # [512, 8] in {8, 25, 43}
IQ2S_GRID = _as(_decode_grid(_gq.IQ2_S), np.uint8)  # [1024, 8] in {8, 25, 43}
IQ3XXS_GRID = _as(_decode_grid(_gq.IQ3_XXS), np.uint8)  # [256, 4] in {4, 12, ..., 62}
IQ3S_GRID = _as(_decode_grid(_gq.IQ3_S), np.uint8)  # [512, 4] in {1, 3, ..., 15}
IQ1S_GRID = _as(_decode_grid(_gq.IQ1_S), np.int8)  # [2048, 8] in {-1, 0, 1} (IQ1_M shares it)

# ksigns_iq2xs: a 7-bit index -> 8 sign bits (bit 7 makes the count of set bits even)
KSIGNS_IQ2XS = np.frombuffer(_gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()  # [128]
KMASK_IQ2XS = (np.uint8(1) << np.arange(8, dtype=np.uint8)).astype(np.uint8)  # [8] 1, 2, 4, ..., 128
# kvalues_mxfp4: E2M1 values doubled (the E8M0 scale is halved to match)
MXFP4_VALUES = np.array(_gq.MXFP4.kvalues, dtype=np.int8)  # [16]
