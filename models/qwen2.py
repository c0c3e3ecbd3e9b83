"""Qwen2 / Qwen2.5.

hparams: qwen2.* common keys; NEOX RoPE (pairs i, i + dim/2), base from rope.freq_base (1e6).
tensors: as llama, plus biases blk.N.attn_q.bias, attn_k.bias, attn_v.bias (float vectors);
  output.weight absent in the small models → tied to token_embd.
load-time fixes: none.
forward: llama's pre-norm SiLU block (models/decoder.py) with q/k/v biases added after projection.
"""

from edged.models.decoder import DecoderModel
from edged.models.llama import build

ARCH = "qwen2"


def load(gf, ops) -> DecoderModel:
    """Load a qwen2-architecture GGUF."""
    return build(gf, ops, neox=True, biases=True)
