"""The decoder takes the CPU's one-call attention block (cpu.attention_block_step) at decode where
its projections run through a K-quant or block-type gemv, and every architecture's greedy tokens
and top-5 logprobs equal those of the general path (the backend without the step): plain
attention (llama), q/k/v biases (qwen2), q/k norms (qwen3), post-attention norms with soft-capping
and a window (gemma2), sinks, an output bias and YaRN (gpt-oss), the 32-element block types
(gemma3 in Q5_0, llama in Q8_0); and every layer whole in the one call (attention, the dense
gated FFN or a qwen3moe layer's routed Q4_K experts, and both residual adds) but gpt-oss's (its
clamped SwiGLU experts run apart)."""

import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.models import load_model
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy


@pytest.mark.parametrize("arch, matrix_type", [("llama", T.Q4_K), ("qwen2", T.Q4_K), ("qwen3", T.Q4_K),
                                                ("gemma2", T.Q4_K), ("gpt-oss", T.Q4_K), ("qwen3moe", T.Q4_K),
                                                ("gemma3", T.Q5_0), ("llama", T.Q8_0)])
def test_decode_takes_the_step_with_the_general_paths_bits(tmp_path, monkeypatch, arch, matrix_type):
    moe = dict(expert_type=T.Q4_K) if arch == "qwen3moe" else {}
    gf = load_gguf(write_tiny_model(tmp_path / "m.gguf", arch, seed=4, n_embd=256, n_heads=4, n_kv_heads=2,
                                    head_dim=64, matrix_type=matrix_type, **moe))
    taken = []
    real = cpu.attention_block_step

    def step(x, *args):
        out = real(x, *args)
        taken.append((x.shape[0], out is not None and (out[1] is None) == (arch != "gpt-oss")))
        return out

    monkeypatch.setattr(cpu, "attention_block_step", step)
    monkeypatch.delattr(cpu, "layers_step")  # layer by layer (the whole stack in one call: test_layers_step.py)
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    fused = greedy(load_model(gf), prompt, 6)
    assert (1, True) in taken  # the decode tokens' layers took it (the whole layer but gpt-oss's)
    monkeypatch.delattr(cpu, "attention_block_step")
    plain = greedy(load_model(gf), prompt, 6)
    assert fused.ids == plain.ids and fused.steps == plain.steps
