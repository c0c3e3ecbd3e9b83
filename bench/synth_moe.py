"""Write a synthetic mixture-of-experts GGUF (qwen3moe graph, random valid Q4_K weights) with realistic
proportions for the MoE benchmark (issue 19): 24 layers, 32 experts, top-4, n_embd 1024, expert FFN 1024
(~1.5 GB). The tokenizer is copied from a real model (default: the store's SmolLM2 file), so both engines
take the same text prompts (bench/peer.py --model OUT.gguf).

Usage: python bench/synth_moe.py OUT.gguf [--layers 24] [--experts 32] [--top-k 4] [--expert-type Q4_K]
       [--tokenizer-from GGUF]
"""

import argparse

import gguf
from gguf import GGMLQuantizationType as T

from synth_writer import SynthTensors, copy_fields

N_EMBD, N_HEAD, N_KV, HEAD_DIM, N_FF_EXP = 1024, 16, 4, 64, 1024


def _copy_tokenizer(wr: gguf.GGUFWriter, src: str) -> int:
    """Copy every tokenizer.* key of `src` into `wr`; returns the vocabulary size."""
    r = gguf.GGUFReader(src)
    copy_fields(wr, r, lambda name: name.startswith("tokenizer."))
    return len(r.fields["tokenizer.ggml.tokens"].data)


def write(path: str, tokenizer_from: str, n_layers: int = 24, n_expert: int = 32, top_k: int = 4,
          seed: int = 0, expert_type: T = T.Q4_K) -> str:
    wr = gguf.GGUFWriter(path, "qwen3moe")
    wr.add_name(f"synthetic qwen3moe {n_layers}L {n_expert}x{top_k} (random weights)")
    vocab = _copy_tokenizer(wr, tokenizer_from)
    wr.add_context_length(32768)
    wr.add_embedding_length(N_EMBD)
    wr.add_block_count(n_layers)
    wr.add_feed_forward_length(N_FF_EXP)
    wr.add_expert_feed_forward_length(N_FF_EXP)
    wr.add_expert_count(n_expert)
    wr.add_expert_used_count(top_k)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_KV)
    wr.add_key_length(HEAD_DIM)
    wr.add_value_length(HEAD_DIM)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_rope_freq_base(1e6)
    st = SynthTensors(wr, seed)
    st.quant("token_embd.weight", T.Q8_0, (vocab, N_EMBD))
    st.quant("output.weight", T.Q6_K, (vocab, N_EMBD))
    st.norm("output_norm.weight", N_EMBD)
    for i in range(n_layers):
        p = f"blk.{i}"
        st.norm(f"{p}.attn_norm.weight", N_EMBD)
        st.quant(f"{p}.attn_q.weight", T.Q4_K, (N_HEAD * HEAD_DIM, N_EMBD))
        st.quant(f"{p}.attn_k.weight", T.Q4_K, (N_KV * HEAD_DIM, N_EMBD))
        st.quant(f"{p}.attn_v.weight", T.Q6_K, (N_KV * HEAD_DIM, N_EMBD))
        st.quant(f"{p}.attn_output.weight", T.Q4_K, (N_EMBD, N_HEAD * HEAD_DIM))
        st.norm(f"{p}.attn_q_norm.weight", HEAD_DIM)
        st.norm(f"{p}.attn_k_norm.weight", HEAD_DIM)
        st.norm(f"{p}.ffn_norm.weight", N_EMBD)
        st.normal(f"{p}.ffn_gate_inp.weight", (n_expert, N_EMBD), 0.05)
        st.quant(f"{p}.ffn_gate_exps.weight", expert_type, (n_expert, N_FF_EXP, N_EMBD))
        st.quant(f"{p}.ffn_up_exps.weight", expert_type, (n_expert, N_FF_EXP, N_EMBD))
        st.quant(f"{p}.ffn_down_exps.weight", expert_type, (n_expert, N_EMBD, N_FF_EXP))
    st.finish()
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--expert-type", default="Q4_K", choices=[t.name for t in T],
                    help="the experts' tensor type (e.g. Q8_0, as Q8_0 downloads of MoE models have)")
    ap.add_argument("--tokenizer-from", default=None, help="GGUF whose tokenizer to copy (default: SmolLM2)")
    a = ap.parse_args()
    src = a.tokenizer_from
    if src is None:
        from edged.model_path import resolve_model_path

        src = str(resolve_model_path("smollm2-135m-instruct"))
    print(write(a.out, src, a.layers, a.experts, a.top_k, expert_type=T[a.expert_type]))
