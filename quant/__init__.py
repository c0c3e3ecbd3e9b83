"""GGUF file and tensor formats: validated loading, the type table, QTensor."""

from edged.quant.dequant import dequantize
from edged.quant.errors import GGUFError
from edged.quant.gguf import GGUFFile, load_gguf
from edged.quant.tensor import QTensor

__all__ = ["GGUFError", "dequantize", "GGUFFile", "QTensor", "load_gguf"]
