"""CPU backend: Numba kernels behind the op set of edged.backends.base.

    matmul, embed, rms_norm, rope, gelu_tanh_mul, silu_mul, softcap, add, scale,
    store_kv, attention, allocate_kv

Note: the function `attention` shadows the submodule of the same name as a package attribute;
reach kernel internals with `from edged.backends.cpu.attention import ...`.
"""

from edged.backends.cpu.activations import add, gelu_tanh_mul, scale, silu_mul, softcap
from edged.backends.cpu.attention import allocate_kv, attention, store_kv
from edged.backends.cpu.embed import embed
from edged.backends.cpu.matmul import matmul
from edged.backends.cpu.norm_rope import rms_norm, rope

__all__ = [
    "add", "allocate_kv", "attention", "embed", "gelu_tanh_mul", "matmul", "rms_norm", "rope",
    "scale", "silu_mul", "softcap", "store_kv",
]
