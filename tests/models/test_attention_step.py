"""The decoder takes the CPU's one-call attention block (cpu.attention_block_step) at decode where
its projections are K-quants, and every architecture's greedy tokens and top-5 logprobs equal those
of the general path (the backend without the step): plain attention (llama), q/k/v biases (qwen2),
q/k norms (qwen3), post-attention norms with soft-capping and a window (gemma2), sinks, an output
bias and YaRN (gpt-oss); and a qwen3moe layer whole (attention, its routed Q4_K experts and both
residual adds) in the one call."""

import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.models import load_model
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gpt-oss", "qwen3moe"])
def test_decode_takes_the_step_with_the_general_paths_bits(tmp_path, monkeypatch, arch):
    moe = dict(expert_type=T.Q4_K) if arch == "qwen3moe" else {}
    gf = load_gguf(write_tiny_model(tmp_path / "m.gguf", arch, seed=4, n_embd=256, n_heads=4, n_kv_heads=2,
                                    head_dim=64, matrix_type=T.Q4_K, **moe))
    taken = []
    real = cpu.attention_block_step

    def step(x, *args):
        out = real(x, *args)
        taken.append((x.shape[0], out is not None and (out[1] is None) == (arch == "qwen3moe")))
        return out

    monkeypatch.setattr(cpu, "attention_block_step", step)
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    fused = greedy(load_model(gf), prompt, 6)
    assert (1, True) in taken  # the decode tokens' layers took it (the whole layer where it is a MoE)
    monkeypatch.delattr(cpu, "attention_block_step")
    plain = greedy(load_model(gf), prompt, 6)
    assert fused.ids == plain.ids and fused.steps == plain.steps
