"""Fetching a model's tensors by name with their expected shapes checked at load time."""

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.models.errors import ModelError
from edged.quant.tensor import QTensor


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
        return qt

    def optional(self, name: str, shape: tuple) -> QTensor | None:
        """Like get, but None when the file has no such tensor."""
        return self.get(name, shape) if name in self.tensors else None

    def vector(self, name: str, n: int, required: bool = True) -> np.ndarray | None:
        """A 1-D float tensor (norm weight, bias, rope factors) as float32 [n]."""
        if not required and name not in self.tensors:
            return None
        return as_f32_vector(self.get(name, (n,)), self.path)


def as_f32_vector(qt: QTensor, path="") -> np.ndarray:
    """float32 view (F32) or copy (F16/BF16) of a 1-D tensor."""
    if qt.qtype == T.F32:
        return qt.data.view(np.float32)
    if qt.qtype == T.F16:
        return qt.data.view(np.float16).astype(np.float32)
    if qt.qtype == T.BF16:
        return (qt.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    raise ModelError(f"{path}: 1-D tensor {qt.name!r} has type {qt.qtype.name}; expected F32, F16 or BF16")
