"""Random but valid GGUF tensor bytes of every supported type, for kernel tests and benchmarks
(the one copy: tests/helpers/qdata.py re-exports it; bench uses it for types a model lacks).

Quant bytes are uniform random; the fp16 scale fields (and MXFP4's E8M0 exponent byte) are overwritten
with small finite values so dequantized weights look like real ones (|w| ~ 0.05) and no inf/nan appears.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.quant.scale_fields import E8M0_FIELDS as _E8M0_FIELDS
from edged.quant.scale_fields import F16_FIELDS as _F16_FIELDS
from edged.quant.scale_fields import SPLIT_F16 as _SPLIT_F16
from edged.quant.tensor import QTensor
from edged.quant.types import traits

# types whose first block scale is an fp16 (set_f16_scale writes it)
F16_SCALED = tuple(_F16_FIELDS) + tuple(_SPLIT_F16)

# nominal scale per type so that |w| is ~0.05 whatever the quant range
_SCALE = {
    T.Q4_0: 0.01, T.Q4_1: 0.01, T.Q5_0: 0.005, T.Q5_1: 0.005, T.Q8_0: 0.0005,
    T.Q2_K: 0.01, T.Q3_K: 0.003, T.Q4_K: 0.0005, T.Q5_K: 0.0003, T.Q6_K: 0.0003,
    T.IQ4_NL: 0.0005, T.IQ4_XS: 0.0005,
    T.IQ2_XXS: 0.001, T.IQ2_XS: 0.001, T.IQ2_S: 0.001, T.IQ3_XXS: 0.0004, T.IQ3_S: 0.0004,
    T.IQ1_S: 0.01, T.IQ1_M: 0.01, T.TQ1_0: 0.07, T.TQ2_0: 0.05, T.MXFP4: 0.01,
}


def set_f16_scale(qtype, blocks: np.ndarray, bits: np.ndarray) -> None:
    """Write fp16 bit patterns `bits` uint16 [n_blocks] as the first fp16 scale of each of `blocks`
    uint8 [n_blocks, type_size] (in place; IQ1_M's d goes into its scales' top nibbles)."""
    qtype = T(qtype)
    bits = np.asarray(bits, dtype=np.uint16)
    if qtype in _SPLIT_F16:
        off = _SPLIT_F16[qtype]
        sc = blocks[:, off : off + 8].copy().view(np.uint16)  # [n_blocks, 4]
        for i in range(4):  # nibble i of d -> bits 12..15 of scales[i]
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        blocks[:, off : off + 8] = sc.view(np.uint8)
    else:
        off = _F16_FIELDS[qtype][0]
        blocks[:, off : off + 2] = bits.view(np.uint8).reshape(-1, 2)


def set_e8m0_scale(qtype, blocks: np.ndarray, e: np.ndarray) -> None:
    """Write E8M0 exponent bytes `e` uint8 [n_blocks] (scale 2^(e - 128)) into each of `blocks`."""
    for off in _E8M0_FIELDS[T(qtype)]:
        blocks[:, off] = np.asarray(e, dtype=np.uint8)


def random_qtensor(qtype, rows: int, cols: int, seed: int = 0, name: str = "w") -> QTensor:
    """A QTensor [rows, cols] of random valid blocks of `qtype`."""
    qtype = T(qtype)
    rng = np.random.default_rng(seed)
    if qtype == T.F32:
        data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32).view(np.uint8)
    elif qtype == T.F16:
        data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16).view(np.uint8)
    elif qtype == T.BF16:
        f = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        data = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        tt = traits(qtype)
        nblk = rows * cols // tt.block_size
        blocks = rng.integers(0, 256, size=(nblk, tt.type_size), dtype=np.uint8)
        for off in _F16_FIELDS.get(qtype, ()):
            s = (rng.uniform(0.5, 1.5, nblk) * _SCALE[qtype] * rng.choice([-1, 1], nblk)).astype(np.float16)
            if qtype in (T.Q4_1, T.Q5_1, T.Q2_K, T.Q4_K, T.Q5_K) and off != _F16_FIELDS[qtype][0]:
                s = np.abs(s)  # min / dmin fields are subtracted; keep them positive like real files
            blocks[:, off : off + 2] = s.view(np.uint8).reshape(nblk, 2)
        if qtype in _SPLIT_F16:
            s = (rng.uniform(0.5, 1.5, nblk) * _SCALE[qtype] * rng.choice([-1, 1], nblk)).astype(np.float16)
            set_f16_scale(qtype, blocks, s.view(np.uint16))
        if qtype in _E8M0_FIELDS:
            # the nominal scale's exponent, +-1 (an unsigned power of two: signs are in the values)
            e = 128 + int(np.round(np.log2(_SCALE[qtype]))) + rng.integers(-1, 2, nblk)
            set_e8m0_scale(qtype, blocks, e.astype(np.uint8))
        data = blocks
    return QTensor(name=name, qtype=qtype, shape=(rows, cols), data=np.ascontiguousarray(data).reshape(-1))
