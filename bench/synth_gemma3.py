"""Write a GGUF with the default model's exact geometry and tensor types (Gemma 3 270M Q4_K_M) and
random valid weights: speed figures on a machine where the real file cannot be installed (the GPU
check machine has no package registry, and 235 MiB does not travel with the working tree).

Usage: python bench/synth_gemma3.py OUT.gguf [--layers 18]
"""

import argparse

import gguf
from gguf import GGMLQuantizationType as T

from synth_writer import SynthTensors

N_EMBD, N_FF, N_HEAD, N_KV, HEAD_DIM, VOCAB = 640, 2048, 4, 1, 256, 262144


def _layer_types(i: int) -> dict:
    """Q4_K_M's mix in the real file: half the layers get Q8_0 attn_v and Q6_K ffn_down."""
    hi = i % 2 == 0
    return {
        "attn_q": (T.Q5_0, N_HEAD * HEAD_DIM, N_EMBD), "attn_k": (T.Q5_0, N_KV * HEAD_DIM, N_EMBD),
        "attn_v": (T.Q8_0 if hi else T.Q5_0, N_KV * HEAD_DIM, N_EMBD),
        "attn_output": (T.Q4_K, N_EMBD, N_HEAD * HEAD_DIM),
        "ffn_gate": (T.Q5_0, N_FF, N_EMBD), "ffn_up": (T.Q5_0, N_FF, N_EMBD),
        "ffn_down": (T.Q6_K if hi else T.Q4_K, N_EMBD, N_FF),
    }


def write(path: str, n_layers: int = 18, seed: int = 0) -> str:
    wr = gguf.GGUFWriter(path, "gemma3")
    wr.add_name("synthetic gemma3 270m (random weights)")
    wr.add_context_length(32768)
    wr.add_embedding_length(N_EMBD)
    wr.add_block_count(n_layers)
    wr.add_feed_forward_length(N_FF)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_KV)
    wr.add_key_length(HEAD_DIM)
    wr.add_value_length(HEAD_DIM)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_rope_freq_base(1e6)
    wr.add_sliding_window(512)
    st = SynthTensors(wr, seed)
    st.quant("token_embd.weight", T.Q8_0, (VOCAB, N_EMBD))
    st.norm("output_norm.weight", N_EMBD)
    for i in range(n_layers):
        p = f"blk.{i}"
        for t, (qtype, rows, cols) in _layer_types(i).items():
            st.quant(f"{p}.{t}.weight", qtype, (rows, cols))
        for t, n in (("attn_norm", N_EMBD), ("post_attention_norm", N_EMBD), ("ffn_norm", N_EMBD),
                     ("post_ffw_norm", N_EMBD), ("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM)):
            st.norm(f"{p}.{t}.weight", n)
    st.finish()
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=18)
    a = ap.parse_args()
    print(write(a.out, a.layers))
