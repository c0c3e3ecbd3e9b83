"""CPU backend: Numba kernels behind the op set of edged.backends.base.

    matmul, matmuls (several weights, one activation quantization), embed, rms_norm, rope, gelu_tanh_mul, silu_mul, swiglu_oai_mul, softcap, add, scale,
    store_kv, attention, allocate_kv, moe_combine, moe_matmul, moe_ffn_step / moe_block_step (a decode step's
    experts, and the router, in one call),
    rope_store_kv (rms_norm + rope + store_kv), attention_block_step (a decode step's attention block),
    layers_step (a decode step's dense layers, all of them, in one call),
    upload, to_host, upload_matrix, prepare_batch, take_rows, slice_cols   (host.py: placement); fuses_rows (matmul.py)

Note: the function `attention` shadows the submodule of the same name as a package attribute;
reach kernel internals with `from edged.backends.cpu.attention import ...`.
"""

from edged.backends.cpu.activations import add, gelu_tanh_mul, scale, silu_mul, softcap, swiglu_oai_mul
from edged.backends.cpu.attention import allocate_kv, attention, store_kv
from edged.backends.cpu.attn_step import attention_block_step
from edged.backends.cpu.embed import embed
from edged.backends.cpu.layers_step import layers_step
from edged.backends.cpu.host import prepare_batch, slice_cols, take_rows, to_host, upload, upload_matrix
from edged.backends.cpu.matmul import fuses_rows, matmul, matmuls
from edged.backends.cpu.moe_combine import moe_combine
from edged.backends.cpu.moe_matmul import moe_matmul
from edged.backends.cpu.moe_step import moe_block_step, moe_ffn_step
from edged.backends.cpu.norm_rope import rms_norm, rope
from edged.backends.cpu.rope_store import rope_store_kv

__all__ = [
    "add", "allocate_kv", "attention", "attention_block_step", "embed", "gelu_tanh_mul", "layers_step", "matmul",
    "matmuls", "moe_block_step", "moe_combine", "moe_ffn_step", "moe_matmul", "prepare_batch", "rms_norm", "rope",
    "rope_store_kv", "scale", "silu_mul", "slice_cols", "softcap", "store_kv", "swiglu_oai_mul", "take_rows", "to_host", "upload",
    "upload_matrix", "fuses_rows",
]
