"""ggml's Q8_K activation quantizer in numpy: the reference for act_quant's grid="q8_K" (kept from
the llama.cpp numerics investigation, docs/investigations/llamacpp_numerics.md)."""

import numpy as np


def quant_q8_K(x: np.ndarray) -> np.ndarray:
    """x [n, k] as quantize_row_q8_K_ref: per 256, iscale = -127/max (max = the value of largest
    magnitude), q = min(127, rne(iscale * x)), value = (1/iscale) * q."""
    n, k = x.shape
    xb = x.astype(np.float32).reshape(n, k // 256, 256)
    idx = np.abs(xb).argmax(-1)[..., None]
    mx = np.take_along_axis(xb, idx, -1)  # [n, k/256, 1] signed
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0.0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale), 127)
    return (q.astype(np.float64) * d).reshape(n, k)
