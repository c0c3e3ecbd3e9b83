"""gpt-oss (gpt-oss-20b, gpt-oss-120b; GGUF architecture "gpt-oss", llama.cpp's openai-moe).

hparams: gpt-oss.* common keys (models/hparams.py); attention.key_length gives head_dim (64;
  n_heads * head_dim = 4096 differs from n_embd = 2880); attention.sliding_window (128, required)
  on the layers llama.cpp's set_swa_pattern(n) makes local (il % n < n - 1; n =
  attention.sliding_window_pattern, default 2: the even layers); NEOX RoPE with YaRN
  (rope.scaling.type "yarn", factor 32 over original_context_length 4096) on every layer, base
  rope.freq_base (rope.freq_base_swa for the sliding layers when present); expert_count (32 / 128),
  expert_used_count (4), expert_feed_forward_length.
tensors: token_embd, output_norm, output (required, as llama.cpp); per block attn_norm,
  attn_q/k/v/output with biases, attn_sinks.weight [n_heads], post_attention_norm (the FFN's
  input norm), the router ffn_gate_inp with its bias [n_expert], and the stacked experts
  ffn_gate_exps, ffn_up_exps [n_expert, n_ff_exp, n_embd] (or one fused ffn_gate_up_exps),
  ffn_down_exps [n_expert, n_embd, n_ff_exp], each with a bias per expert (MXFP4 in the released
  files).
load-time fixes: none.
forward: llama.cpp's llm_build_openai_moe_iswa: models/decoder.py's pre-norm block with q/k/v/o
  biases, attention sinks and scale 1/sqrt(head_dim); then models/moe.py with "softmax_topk"
  gating (top-k of the biased router logits, softmax over the chosen) and the clamped SwiGLU
  "swiglu_oai" (alpha 1.702, limit 7) in every layer; no expert weight scaling.
"""

import math

from edged.backends.base import RopeParams
from edged.models.decoder import DecoderModel, LayerWeights, attention_weights, vocab_rows
from edged.models.gemma3 import is_sliding
from edged.models.hparams import finite_positive, int_range, read_expert_hparams, read_hparams
from edged.models.moe import moe_weights
from edged.models.tensors import TensorSet

ARCH = "gpt-oss"
SWA_PATTERN = 2  # llama.cpp's default: every other layer (the even ones) attends through the window


def load(gf, ops) -> DecoderModel:
    """Load a gpt-oss-architecture GGUF."""
    ts = TensorSet(gf)
    hp = read_hparams(gf, vocab_rows(ts), yarn=True)
    window = int_range(gf, f"{ARCH}.attention.sliding_window", hi=hp.context_length)  # required, as llama.cpp
    hp.sliding_window = window
    # a layer period; the per-layer array form llama.cpp also reads is a type error naming the key
    pattern = int_range(gf, f"{ARCH}.attention.sliding_window_pattern", lo=1, default=SWA_PATTERN)
    base_swa = finite_positive(gf, f"{ARCH}.rope.freq_base_swa", default=hp.rope_base)
    hp.extra.update(swa_pattern=pattern, rope_base_swa=base_swa)
    ex = read_expert_hparams(gf, hp)
    rope = RopeParams(dim=hp.rope_dim, freq_base=hp.rope_base, neox=True, freq_scale=hp.rope_freq_scale,
                      **hp.yarn_rope())
    rope_swa = rope if base_swa == hp.rope_base else RopeParams(
        dim=hp.rope_dim, freq_base=base_swa, neox=True, freq_scale=hp.rope_freq_scale, **hp.yarn_rope())
    layers = []
    for i in range(hp.n_layers):
        p = f"blk.{i}"
        local = is_sliding(i, window, pattern)
        moe = moe_weights(ts, p, hp, ex, gating="softmax_topk", norm_topk=False, router_bias=True,
                          expert_biases=True)
        moe.weights_scale = 1.0  # llama.cpp's graph never scales gpt-oss's expert weights
        layers.append(LayerWeights(
            attn_norm=ts.vector(f"{p}.attn_norm.weight", hp.n_embd),
            attn=attention_weights(ts, p, hp, biases=True, out_bias=True, sinks=True),
            ffn_norm=ts.vector(f"{p}.post_attention_norm.weight", hp.n_embd),
            ffn=None,
            moe=moe,
            rope=rope_swa if local else rope,
            window=window if local else 0,
        ))
    tok = ts.get("token_embd.weight", (hp.vocab_size, hp.n_embd))
    norm = ts.vector("output_norm.weight", hp.n_embd)
    out = ts.get("output.weight", (hp.vocab_size, hp.n_embd))
    return DecoderModel(hp, tok, norm, out, layers, ops, attn_scale=1.0 / math.sqrt(hp.head_dim),
                        ffn_act="swiglu_oai")
