"""The tensor types the CUDA backend multiplies by, answerable without importing numba.cuda: the
planner asks before it chooses the device (and a CPU-only process must never load numba.cuda)."""

from gguf import GGMLQuantizationType as T

from edged.quant.types import TYPE_TRAITS, traits

FLOAT_TYPES = (T.F32, T.F16, T.BF16)
# dequant.DECODERS' keys (matmul.py checks the two agree at import)
INT_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


def supported_types() -> tuple:
    """Types with a CUDA matmul kernel, in TYPE_TRAITS order."""
    return tuple(t for t in TYPE_TRAITS if t in FLOAT_TYPES or t in INT_TYPES)


def check_supported(qtype) -> None:
    """Raise ValueError (naming the type) unless a CUDA matmul kernel exists for `qtype`."""
    tt = traits(qtype)  # ValueError for types edged does not know at all
    if tt.qtype not in FLOAT_TYPES and tt.qtype not in INT_TYPES:
        names = ", ".join(t.name for t in supported_types())
        raise ValueError(f"no CUDA matmul kernel for tensor type {tt.qtype.name}; supported: {names}")
