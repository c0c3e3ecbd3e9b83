"""Test helpers for quantized data: random valid tensors (edged.quant.synth, shared with the
benchmarks) and the gguf-py reference dequantizer."""

import numpy as np

from edged.quant.synth import random_qtensor  # noqa: F401  (re-exported for tests)
from edged.quant.tensor import QTensor


def reference_dequantize(w: QTensor) -> np.ndarray:
    """float32 [rows, cols] via gguf-py's own dequantizer (the ground truth for every test)."""
    from gguf.quants import dequantize

    if w.grouped:
        raise ValueError(f"{w.name!r}: grouped rows (the CPU backend's layout) are not GGUF's")
    raw = w.data.reshape(w.n_rows, -1)
    return dequantize(raw, w.qtype).astype(np.float32).reshape(w.shape)
