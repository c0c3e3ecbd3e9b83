"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, a mixture of experts in every layer.

hparams: qwen3moe.* common keys; expert_count, expert_used_count (in [1, expert_count]),
  expert_feed_forward_length (absent: feed_forward_length / expert_used_count, as llama.cpp),
  expert_weights_scale (optional); attention.key_length gives head_dim; NEOX RoPE, rope.scaling
  as qwen3 (linear or yarn).
tensors: as qwen3 (q/k norms [head_dim], no biases, output.weight optional), but per block instead
  of ffn_gate/up/down the router ffn_gate_inp [n_expert, n_embd] and the stacked experts
  ffn_gate_exps, ffn_up_exps [n_expert, n_ff_exp, n_embd], ffn_down_exps [n_expert, n_embd, n_ff_exp].
load-time fixes: none.
forward: llama.cpp's qwen3moe graph: Qwen3's pre-norm attention, then models/moe.py with softmax
  gating over all experts, top-k, the chosen weights renormalised to sum 1, SwiGLU experts.
"""

import math

from edged.models.decoder import DecoderModel, LayerWeights, attention_weights, embeddings_and_output, vocab_rows
from edged.models.hparams import read_expert_hparams, read_hparams
from edged.models.llama import rope_params
from edged.models.moe import moe_weights
from edged.models.tensors import TensorSet

ARCH = "qwen3moe"


def load(gf, ops) -> DecoderModel:
    """Load a qwen3moe-architecture GGUF."""
    ts = TensorSet(gf)
    hp = read_hparams(gf, vocab_rows(ts), yarn=True)
    ex = read_expert_hparams(gf, hp)
    rope = rope_params(ts, hp, neox=True)
    layers = []
    for i in range(hp.n_layers):
        p = f"blk.{i}"
        layers.append(LayerWeights(
            attn_norm=ts.vector(f"{p}.attn_norm.weight", hp.n_embd),
            attn=attention_weights(ts, p, hp, qk_norm=True),
            ffn_norm=ts.vector(f"{p}.ffn_norm.weight", hp.n_embd),
            ffn=None,
            moe=moe_weights(ts, p, hp, ex, gating="softmax", norm_topk=True),
            rope=rope,
        ))
    tok, norm, out = embeddings_and_output(ts, hp)
    return DecoderModel(hp, tok, norm, out, layers, ops,
                        attn_scale=1.0 / math.sqrt(hp.head_dim), ffn_act="silu")
