"""Where each block type keeps its float scales (ggml's block layouts): random-block synthesis
(synth.py) writes them, the load-time finiteness check (models/tensors.py) reads them."""

import numpy as np
from gguf import GGMLQuantizationType as T

# byte offsets of fp16 scale fields inside one block, per type
F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),
    T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,), T.IQ1_S: (0,),
    T.TQ1_0: (52,), T.TQ2_0: (64,),
}
# IQ1_M has no whole fp16 field: its d is the top nibbles of the 4 uint16 scales at this offset
SPLIT_F16 = {T.IQ1_M: 48}
# E8M0 scale bytes: the block scale is the power of two 2^(e - 128) (MXFP4's doubled value table)
E8M0_FIELDS = {T.MXFP4: (0,)}
# the largest E8M0 byte whose block stays finite: 12 (the largest level) * 2^(e - 128) < 2^128
E8M0_MAX_FINITE = 252
# the largest E8M0 byte a file may hold: weights up to 12 * 2^19 = 6.3e6, the range fp16 scales give
# the other types (65504 * 127 = 8.3e6); past it a finite 2.5e38 weight overflowed the matmul
E8M0_MAX = 147


def split_f16_bits(blocks: np.ndarray, off: int) -> np.ndarray:
    """IQ1_M's d as uint16 fp16 bits [n_blocks] from blocks uint8 [n_blocks, type_size]."""
    sc = blocks[:, off:off + 8].copy().view(np.uint16)  # [n_blocks, 4]
    return ((sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00)
            | (sc[:, 3] & 0xF000)).astype(np.uint16)
