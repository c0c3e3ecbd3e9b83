"""Gemma 2 (2B, 9B, 27B).

hparams: gemma2.* common keys; attention.key_length = head_dim (256 on 2B/9B, 128 on 27B);
  attention.sliding_window (4096; llama.cpp's default when absent, capped here at the context);
  attn_logit_softcapping (default 50) and final_logit_softcapping (default 30), both always applied
  (llama.cpp attn_soft_cap = true). Layer il uses the sliding window when il is even
  (llama.cpp set_swa_pattern(2): local, global, local, ...). One RoPE for every layer (NEOX,
  rope.freq_base, linear rope.scaling): llama.cpp's SWA base and scale default to the global ones.
  Attention scale 1/sqrt(head_dim), except the 27B (46 layers): 1/sqrt(n_embd / n_heads).
tensors: token_embd (tied output when output.weight is absent), output_norm; per block attn_norm,
  attn_q/k/v/output (no q/k norms), post_attention_norm, ffn_norm, ffn_gate/up/down, post_ffw_norm.
load-time fixes: none — the converter folded Gemma's `1 +` into every norm weight, as for Gemma 3.
forward: embeddings × sqrt(n_embd), Gemma 3's sandwich block (models/gemma3.py) without q/k norms,
  attention logits softcapped before the softmax, final logits softcapped.
"""

import math

import numpy as np

from edged.backends.base import RopeParams
from edged.models.decoder import DecoderModel, embeddings_and_output, vocab_rows
from edged.models.gemma3 import attention_scale, check_window, is_sliding, sandwich_layer
from edged.models.hparams import in_open_interval, read_hparams
from edged.models.tensors import TensorSet

ARCH = "gemma2"
SWA_PATTERN = 2  # even layers local, odd layers global
DEFAULT_WINDOW = 4096
ATTN_SOFTCAP = 50.0  # llama.cpp's defaults when the keys are absent
FINAL_SOFTCAP = 30.0
# a cap below float32's smallest normal makes the kernels' 1/cap infinite and 0 * inf = NaN
_SOFTCAP_RANGE = (float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max))


def softcap(gf, key: str, default: float) -> float:
    """A softcapping key: finite and large enough that its float32 reciprocal is finite."""
    return in_open_interval(gf, key, *_SOFTCAP_RANGE, default=default)


def load(gf, ops) -> DecoderModel:
    """Load a gemma2-architecture GGUF."""
    ts = TensorSet(gf)
    hp = read_hparams(gf, vocab_rows(ts))
    if f"{ARCH}.attention.sliding_window" not in gf:
        hp.sliding_window = min(DEFAULT_WINDOW, hp.context_length)
    check_window(gf, hp)
    attn_cap = softcap(gf, f"{ARCH}.attn_logit_softcapping", ATTN_SOFTCAP)
    final_cap = softcap(gf, f"{ARCH}.final_logit_softcapping", FINAL_SOFTCAP)
    hp.extra["swa_pattern"] = SWA_PATTERN
    rope = RopeParams(dim=hp.rope_dim, freq_base=hp.rope_base, neox=True, freq_scale=hp.rope_freq_scale)
    layers = []
    for i in range(hp.n_layers):
        window = hp.sliding_window if is_sliding(i, hp.sliding_window, SWA_PATTERN) else 0
        layers.append(sandwich_layer(ts, i, hp, rope, window, qk_norm=False))
    tok, norm, out = embeddings_and_output(ts, hp)
    return DecoderModel(hp, tok, norm, out, layers, ops, attn_scale=attention_scale(hp, n_layers_27b=46),
                        ffn_act="gelu_tanh", embed_scale=math.sqrt(hp.n_embd), final_softcap=final_cap,
                        attn_softcap=attn_cap)
