"""Qwen3 (dense).

hparams: qwen3.* common keys; attention.key_length gives head_dim (n_heads*head_dim may differ from
  n_embd); NEOX RoPE.
tensors: as llama, plus per-head RMS norm weights blk.N.attn_q_norm.weight, attn_k_norm.weight
  [head_dim]; no biases; output.weight optional (tied).
load-time fixes: none.
forward: llama's pre-norm SiLU block (models/decoder.py) with q/k RMS-normed per head before RoPE.
"""

from edged.models.decoder import DecoderModel
from edged.models.llama import build

ARCH = "qwen3"


def load(gf, ops) -> DecoderModel:
    """Load a qwen3-architecture GGUF."""
    return build(gf, ops, neox=True, qk_norm=True)
