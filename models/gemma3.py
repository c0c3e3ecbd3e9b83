"""Gemma 3 (text; the default model).

hparams: gemma3.* common keys; attention.key_length = head_dim (256 for 270M: n_heads*head_dim ≠
  n_embd); attention.sliding_window (512). Layer il uses the sliding window unless
  (il + 1) % 6 == 0 (llama.cpp set_swa_pattern(6): 5 local : 1 global). Local layers use RoPE base
  10000 and no scaling (llama.cpp rope_freq_base_train_swa); global layers rope.freq_base (1e6) with
  rope.scaling (linear factor 8 on the 4B+). NEOX RoPE. Attention scale 1/sqrt(head_dim), except the
  27B (62 layers): 1/sqrt(n_embd / n_heads) (llama.cpp f_attention_scale). final_logit_softcapping
  applies only without sliding window, as in llama.cpp's non-iSWA graph.
tensors: token_embd (tied output when output.weight is absent), output_norm; per block attn_norm,
  attn_q/k/v/output, attn_q_norm/attn_k_norm [head_dim], post_attention_norm, ffn_norm,
  ffn_gate/up/down, post_ffw_norm.
load-time fixes: none — the GGUF converter already folded Gemma's `1 +` into every norm weight
  (verified against llama.cpp's reference logits), so the weights are used as stored.
forward: embeddings × sqrt(n_embd) (float32), then models/decoder.py's block with q/k norms,
  post-attention and post-FFN (sandwich) norms and a GELU-tanh gated FFN.
"""

import math

from edged.backends.base import RopeParams
from edged.models.decoder import (DecoderModel, LayerWeights, attention_weights,
                                  embeddings_and_output, ffn_weights, vocab_rows)
from edged.models.hparams import fail, finite_positive, read_hparams
from edged.models.tensors import TensorSet

ARCH = "gemma3"
SWA_PATTERN = 6  # every 6th layer is global
ROPE_BASE_SWA = 10000.0


def is_sliding(il: int, sliding_window: int, pattern: int = SWA_PATTERN) -> bool:
    """Whether layer il attends through the sliding window (llama.cpp set_swa_pattern: the last
    layer of every `pattern` is global)."""
    return sliding_window > 0 and il % pattern < pattern - 1


def check_window(gf, hp) -> None:
    """A sliding window longer than the context is a damaged file (0: no window)."""
    if hp.sliding_window > hp.context_length:
        fail(gf.path, f"{hp.arch}.attention.sliding_window", hp.sliding_window,
             f"must be at most {hp.arch}.context_length = {hp.context_length} (0: no window)")


def attention_scale(hp, n_layers_27b: int) -> float:
    """1/sqrt(head_dim), except the 27B (`n_layers_27b` blocks): 1/sqrt(n_embd / n_heads)
    (llama.cpp f_attention_scale, after gemma_pytorch's query_pre_attn_scalar)."""
    if hp.n_layers == n_layers_27b:
        return 1.0 / math.sqrt(hp.n_embd // hp.n_heads)
    return 1.0 / math.sqrt(hp.head_dim)


def sandwich_layer(ts, i: int, hp, rope: RopeParams, window: int, qk_norm: bool) -> LayerWeights:
    """Block i of a Gemma: attn_norm, attention, post_attention_norm, ffn_norm, FFN, post_ffw_norm."""
    p = f"blk.{i}"
    return LayerWeights(
        attn_norm=ts.vector(f"{p}.attn_norm.weight", hp.n_embd),
        attn=attention_weights(ts, p, hp, qk_norm=qk_norm),
        post_attn_norm=ts.vector(f"{p}.post_attention_norm.weight", hp.n_embd),
        ffn_norm=ts.vector(f"{p}.ffn_norm.weight", hp.n_embd),
        ffn=ffn_weights(ts, p, hp),
        post_ffn_norm=ts.vector(f"{p}.post_ffw_norm.weight", hp.n_embd),
        rope=rope,
        window=window,
    )


def load(gf, ops) -> DecoderModel:
    """Load a gemma3-architecture GGUF."""
    ts = TensorSet(gf)
    hp = read_hparams(gf, vocab_rows(ts))
    check_window(gf, hp)
    softcap = finite_positive(gf, "gemma3.final_logit_softcapping", default=None)  # None: absent
    hp.extra["rope_base_swa"] = ROPE_BASE_SWA
    hp.extra["swa_pattern"] = SWA_PATTERN
    rope_global = RopeParams(dim=hp.rope_dim, freq_base=hp.rope_base, neox=True,
                             freq_scale=hp.rope_freq_scale)
    rope_local = RopeParams(dim=hp.rope_dim, freq_base=ROPE_BASE_SWA, neox=True, freq_scale=1.0)
    layers = []
    for i in range(hp.n_layers):
        local = is_sliding(i, hp.sliding_window)
        layers.append(sandwich_layer(ts, i, hp, rope_local if local else rope_global,
                                     hp.sliding_window if local else 0, qk_norm=True))
    tok, norm, out = embeddings_and_output(ts, hp)
    attn_scale = attention_scale(hp, n_layers_27b=62)
    softcap = 0.0 if hp.sliding_window or softcap is None else softcap
    return DecoderModel(hp, tok, norm, out, layers, ops, attn_scale=attn_scale, ffn_act="gelu_tanh",
                        embed_scale=math.sqrt(hp.n_embd), final_softcap=softcap)
