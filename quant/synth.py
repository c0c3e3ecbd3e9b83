"""Random but valid GGUF tensor bytes of every supported type, for kernel tests and benchmarks
(the one copy: tests/helpers/qdata.py re-exports it; bench uses it for types a model lacks).

Quant bytes are uniform random; the fp16 scale fields are overwritten with small finite values so
dequantized weights look like real ones (|w| ~ 0.05) and no inf/nan appears.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.quant.tensor import QTensor
from edged.quant.types import traits

# byte offsets of fp16 scale fields inside one block, per type
_F16_FIELDS = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}

# nominal scale per type so that |w| is ~0.05 whatever the quant range
_SCALE = {
    T.Q4_0: 0.01, T.Q4_1: 0.01, T.Q5_0: 0.005, T.Q5_1: 0.005, T.Q8_0: 0.0005,
    T.Q2_K: 0.01, T.Q3_K: 0.003, T.Q4_K: 0.0005, T.Q5_K: 0.0003, T.Q6_K: 0.0003,
    T.IQ4_NL: 0.0005, T.IQ4_XS: 0.0005,
}


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
        for off in _F16_FIELDS[qtype]:
            s = (rng.uniform(0.5, 1.5, nblk) * _SCALE[qtype] * rng.choice([-1, 1], nblk)).astype(np.float16)
            if qtype in (T.Q4_1, T.Q5_1, T.Q2_K, T.Q4_K, T.Q5_K) and off != _F16_FIELDS[qtype][0]:
                s = np.abs(s)  # min / dmin fields are subtracted; keep them positive like real files
            blocks[:, off : off + 2] = s.view(np.uint8).reshape(nblk, 2)
        data = blocks
    return QTensor(name=name, qtype=qtype, shape=(rows, cols), data=np.ascontiguousarray(data).reshape(-1))
