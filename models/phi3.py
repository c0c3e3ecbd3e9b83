"""Phi-3 (mini/medium, 4k context variants).

hparams: phi3.* common keys; rope.dimension_count; NEOX RoPE. phi3.attention.sliding_window is
  ignored, as current llama.cpp does (its Phi-3 SWA is disabled: full causal attention).
tensors: fused blk.N.attn_qkv.weight [(n_heads + 2*n_kv_heads)*head_dim, n_embd] (rows q|k|v;
  separate attn_q/k/v also accepted), blk.N.ffn_up.weight [2*n_ff, n_embd] holding gate|up,
  ffn_down; output.weight.
load-time fixes: the 128k variants' LongRoPE factors (rope_factors_long/short) are not supported:
  a clear ModelError.
forward: llama's pre-norm block (models/decoder.py); FFN silu(gate) * up from the fused projection.
"""

from edged.models.decoder import DecoderModel
from edged.models.errors import ModelError
from edged.models.llama import build

ARCH = "phi3"


def load(gf, ops) -> DecoderModel:
    """Load a phi3-architecture GGUF."""
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in gf.tensors:
            raise ModelError(f"{gf.path}: tensor {name!r}: LongRoPE (Phi-3 128k) is not supported")
    return build(gf, ops, neox=True, fused=True)
