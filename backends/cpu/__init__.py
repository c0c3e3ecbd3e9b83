"""CPU backend: Numba kernels behind the op set of edged.backends.base.

    matmul, embed, rms_norm, rope, gelu_tanh_mul, silu_mul, softcap, add, scale,
    store_kv, attention, allocate_kv
"""

from edged.backends.cpu.activations import add, gelu_tanh_mul, scale, silu_mul, softcap
from edged.backends.cpu.attention import allocate_kv, attention, store_kv
from edged.backends.cpu.matmul import matmul
from edged.backends.cpu.norm_rope import rms_norm, rope

try:  # embed.py is being written in parallel; a plain import once it lands
    from edged.backends.cpu.embed import embed
except ImportError as _e:  # pragma: no cover - temporary until embed.py is committed
    _embed_error = _e

    def embed(w, ids):
        raise ImportError(f"edged.backends.cpu.embed is unavailable: {_embed_error}")


__all__ = [
    "add", "allocate_kv", "attention", "embed", "gelu_tanh_mul", "matmul", "rms_norm", "rope",
    "scale", "silu_mul", "softcap", "store_kv",
]
