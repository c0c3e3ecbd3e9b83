"""Fetching a model's tensors by name with their expected shapes checked at load time."""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from edged.models.errors import ModelError
from edged.quant.scale_fields import E8M0_FIELDS, E8M0_MAX, F16_FIELDS, SPLIT_F16, split_f16_bits
from edged.quant.tensor import QTensor


# |value| bound of 1-D float tensors: about 600x the largest in the reference model (1657, a Gemma 3
# post-FFN norm), far below where activations overflow float32
VECTOR_LIMIT = 1e6


class TensorSet:
    """The tensors of one GGUF file, handed out by name with shape checks; tracks which were used."""

    def __init__(self, gf):
        self.path = gf.path
        self.tensors = gf.tensors  # name -> QTensor

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, shape: tuple) -> QTensor:
        """The tensor `name` of numpy-order `shape` (rows, cols); ModelError if absent or mis-shaped."""
        qt = self.tensors.get(name)
        if qt is None:
            raise ModelError(f"{self.path}: missing tensor {name!r} (expected shape {tuple(shape)})")
        if tuple(qt.shape) != tuple(shape):
            raise ModelError(f"{self.path}: tensor {name!r} has shape {tuple(qt.shape)}, "
                             f"expected {tuple(shape)}")
        check_finite(qt, self.path)
        return qt

    def optional(self, name: str, shape: tuple) -> QTensor | None:
        """Like get, but None when the file has no such tensor."""
        return self.get(name, shape) if name in self.tensors else None

    def vector(self, name: str, n: int, required: bool = True) -> np.ndarray | None:
        """A 1-D float tensor (norm weight, bias, rope factors) as float32 [n]."""
        if not required and name not in self.tensors:
            return None
        v = as_f32_vector(self.get(name, (n,)), self.path)
        if n and float(np.abs(v).max()) > VECTOR_LIMIT:  # a 1e36 norm weight loaded and overflowed the logits
            raise ModelError(f"{self.path}: tensor {name!r} holds {float(np.abs(v).max()):.4g}: norm weights, "
                             f"biases and RoPE factors must be within +-{VECTOR_LIMIT:g}; the file is damaged")
        return v


def as_f32_vector(qt: QTensor, path="") -> np.ndarray:
    """float32 view (F32) or copy (F16/BF16) of a 1-D tensor."""
    if qt.qtype == T.F32:
        return qt.data.view(np.float32)
    if qt.qtype == T.F16:
        return qt.data.view(np.float16).astype(np.float32)
    if qt.qtype == T.BF16:
        return (qt.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    raise ModelError(f"{path}: 1-D tensor {qt.name!r} has type {qt.qtype.name}; expected F32, F16 or BF16")


def check_finite(qt: QTensor, path="") -> None:
    """ModelError if a float tensor holds a NaN or inf, or a quantized one a NaN or inf block scale
    (found by fuzzing: such a file loaded and gave NaN logits). One vectorised pass over the values
    or the scales (every page of the tensor is read once; the first forward pass reads them anyway)."""
    if qt.qtype == T.F32:
        bad = not np.isfinite(qt.data.view(np.float32)).all()
    elif qt.qtype in (T.F16, T.BF16):  # all exponent bits set: inf or NaN
        mask = 0x7C00 if qt.qtype == T.F16 else 0x7F80
        bad = ((qt.data.view(np.uint16) & mask) == mask).any()
    elif qt.qtype in F16_FIELDS:  # the high byte of each little-endian float16 scale
        blocks = qt.data.reshape(-1, GGML_QUANT_SIZES[qt.qtype][1])
        bad = any(((blocks[:, o + 1] & 0x7C) == 0x7C).any() for o in F16_FIELDS[qt.qtype])
    elif qt.qtype in SPLIT_F16:
        blocks = qt.data.reshape(-1, GGML_QUANT_SIZES[qt.qtype][1])
        bad = ((split_f16_bits(blocks, SPLIT_F16[qt.qtype]) & 0x7C00) == 0x7C00).any()
    elif qt.qtype in E8M0_FIELDS:  # a power-of-two scale so large that the matmuls overflow float32
        blocks = qt.data.reshape(-1, GGML_QUANT_SIZES[qt.qtype][1])
        bad = any((blocks[:, o] > E8M0_MAX).any() for o in E8M0_FIELDS[qt.qtype])
    else:
        return
    if bad:
        if qt.qtype in (T.F32, T.F16, T.BF16):
            at = int(np.flatnonzero(~np.isfinite(as_f32_vector(qt, path)))[0])
            what = f"values (the first at [{at}] of the flattened tensor)"
        elif qt.qtype in E8M0_FIELDS:
            raise ModelError(f"{path}: tensor {qt.name!r} ({qt.qtype.name}) has block scales past "
                             f"2^{E8M0_MAX - 128} (E8M0 bytes > {E8M0_MAX}): the file is damaged")
        else:
            what = "block scales"
        raise ModelError(f"{path}: tensor {qt.name!r} ({qt.qtype.name}) has NaN or infinite {what}: "
                         "the file is damaged")
