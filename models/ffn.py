"""The gated feed-forward block: its activations by name (one table, for dense layers and for
mixture-of-experts experts alike) and the dense FFN of models/decoder.py's FeedForwardWeights.

    y = down(act(gate(h), up(h)))      act: GATED_ACTIVATIONS[name](ops, gate [n, f], up [n, f]) -> [n, f]
"""

# name -> the backend op applying it to (gate, up); an architecture names one (DecoderModel ffn_act)
GATED_ACTIVATIONS = {
    "silu": lambda ops, gate, up: ops.silu_mul(gate, up),  # SwiGLU: llama, qwen, phi3, qwen3moe
    "gelu_tanh": lambda ops, gate, up: ops.gelu_tanh_mul(gate, up),  # GEGLU with ggml_gelu's tanh form
    "swiglu_oai": lambda ops, gate, up: ops.swiglu_oai_mul(gate, up),  # gpt-oss's clamped SwiGLU
}


def matmuls(ops, ws, h) -> list:
    """[h @ w.T for w in ws]: through the backend's matmuls (one activation quantization for all;
    the CPU's) where it has one."""
    fn = getattr(ops, "matmuls", None)
    return fn(ws, h) if fn is not None else [ops.matmul(w, h) for w in ws]


def gated_ffn(ops, f, h, act: str):
    """act(h @ gate, h @ up) @ down for FeedForwardWeights f (gate|up fused in f.up when f.gate is
    None); h [n, n_embd] -> [n, n_embd]."""
    if f.gate is None:
        gu = ops.matmul(f.up, h)  # [n, 2*n_ff]: gate | up
        half = gu.shape[1] // 2
        gate, up = ops.slice_cols(gu, 0, half), ops.slice_cols(gu, half, 2 * half)
    else:
        gate, up = matmuls(ops, (f.gate, f.up), h)  # [n, n_ff] each
    return ops.matmul(f.down, GATED_ACTIVATIONS[act](ops, gate, up))  # [n, n_embd]
