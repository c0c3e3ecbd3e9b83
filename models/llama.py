"""Llama 2/3 (also TinyLlama, SmolLM; Mistral loads as an alias).

hparams: llama.* common keys (models/hparams.py); rope.dimension_count; rope.scaling.type
  "linear" (positions times 1/factor), "yarn" (factor, original_context_length, attn_factor,
  yarn_beta_fast/slow: backends/rope.py) or Llama 3's per-frequency divisors in the
  `rope_freqs.weight` tensor [rope_dim/2] (used whenever present, as llama.cpp does).
tensors: token_embd, output_norm, output (absent → tied to token_embd); per block blk.N.attn_norm,
  attn_q/k/v/output, ffn_norm, ffn_gate/up/down.
load-time fixes: none — the converter permuted Q/K rows for the interleaved (non-NEOX) RoPE.
forward: pre-norm block of models/decoder.py with SiLU-gated FFN, scale 1/sqrt(head_dim).
"""

import math

import numpy as np

from edged.backends.base import RopeParams
from edged.models.decoder import (DecoderModel, LayerWeights, attention_weights,
                                  embeddings_and_output, ffn_weights, vocab_rows)
from edged.models.errors import ModelError
from edged.models.hparams import check_rope_angles, read_hparams
from edged.models.tensors import TensorSet

ARCH = "llama"


def rope_params(ts, hp, neox: bool) -> RopeParams:
    """RoPE of a llama-family model: base, linear scale, optional rope_freqs divisors."""
    factors = ts.vector("rope_freqs.weight", hp.rope_dim // 2, required=False)
    if hp.rope_scaling == "llama3" and factors is None:
        raise ModelError(f"{ts.path}: rope scaling 'llama3' needs the tensor 'rope_freqs.weight' "
                         f"(shape ({hp.rope_dim // 2},))")
    if factors is not None:  # per-frequency divisors: a zero, negative or NaN one breaks every angle
        bad = np.flatnonzero(~(np.isfinite(factors) & (factors > 0)))
        if len(bad):
            raise ModelError(f"{ts.path}: tensor 'rope_freqs.weight'[{int(bad[0])}] = "
                             f"{float(factors[bad[0]])!r}: must be finite and > 0")
        check_rope_angles(ts.path, f"{hp.arch}.rope.freq_base, tensor 'rope_freqs.weight'", hp,
                          min_factor=float(factors.min()))
    return RopeParams(dim=hp.rope_dim, freq_base=hp.rope_base, neox=neox,
                      freq_scale=hp.rope_freq_scale, freq_factors=factors, **hp.yarn_rope())


def build(gf, ops, *, neox: bool, biases: bool = False, qk_norm: bool = False,
          fused: bool = False) -> DecoderModel:
    """A pre-norm SiLU decoder (llama and its relatives, which differ only in these flags)."""
    ts = TensorSet(gf)
    hp = read_hparams(gf, vocab_rows(ts), yarn=True)
    rope = rope_params(ts, hp, neox)
    layers = []
    for i in range(hp.n_layers):
        p = f"blk.{i}"
        layers.append(LayerWeights(
            attn_norm=ts.vector(f"{p}.attn_norm.weight", hp.n_embd),
            attn=attention_weights(ts, p, hp, fused=fused, biases=biases, qk_norm=qk_norm),
            ffn_norm=ts.vector(f"{p}.ffn_norm.weight", hp.n_embd),
            ffn=ffn_weights(ts, p, hp, fused_gate_up=fused),
            rope=rope,
        ))
    tok, norm, out = embeddings_and_output(ts, hp)
    return DecoderModel(hp, tok, norm, out, layers, ops,
                        attn_scale=1.0 / math.sqrt(hp.head_dim), ffn_act="silu")


def load(gf, ops) -> DecoderModel:
    """Load a llama-architecture GGUF (interleaved RoPE)."""
    return build(gf, ops, neox=False)
