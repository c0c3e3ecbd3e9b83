"""Clear errors for files edged cannot run: unknown architecture, missing tensor, wrong shape,
unsupported hyper-parameters; plus the registry's aliases."""

import gguf
import pytest

import tests.helpers.numpy_ops as numpy_ops
from edged.models import ALIASES, ModelError, architecture_module, load_model, supported_architectures
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model


def _load(path):
    return load_model(load_gguf(path), numpy_ops)


def test_supported_list():
    assert supported_architectures() == ["gemma2", "gemma3", "gpt-oss", "llama", "mistral", "phi3", "qwen2",
                                         "qwen3", "qwen3moe"]
    assert ALIASES["mistral"] == "llama"
    assert architecture_module("mistral").ARCH == "llama"
    assert issubclass(ModelError, ValueError)


def test_unknown_architecture(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "llama", arch_name="gpt2")
    with pytest.raises(ModelError, match=r"unsupported architecture 'gpt2'.*gemma3, gpt-oss, llama, mistral, phi3, qwen2, qwen3"):
        _load(path)


def test_missing_tensor(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", omit=("blk.3.attn_k_norm.weight",))
    with pytest.raises(ModelError, match=r"missing tensor 'blk\.3\.attn_k_norm\.weight' \(expected shape \(32,\)\)"):
        _load(path)


def test_missing_bias(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "qwen2", omit=("blk.1.attn_v.bias",))
    with pytest.raises(ModelError, match=r"missing tensor 'blk\.1\.attn_v\.bias'"):
        _load(path)


def test_wrong_shape(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "llama", reshape={"blk.1.ffn_up.weight": (128, 128)})
    with pytest.raises(ModelError, match=r"'blk\.1\.ffn_up\.weight' has shape \(128, 128\), expected \(256, 64\)"):
        _load(path)


def test_wrong_norm_shape(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3", reshape={"blk.0.attn_q_norm.weight": (2, 16)})
    with pytest.raises(ModelError, match=r"'blk\.0\.attn_q_norm\.weight' has shape \(2, 16\), expected \(32,\)"):
        _load(path)


def test_missing_embeddings(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "phi3", omit=("token_embd.weight",))
    with pytest.raises(ModelError, match="token_embd.weight"):
        _load(path)


def test_unsupported_rope_scaling(tmp_path):
    scaling = {"llama.rope.scaling.type": ("longrope", gguf.GGUFValueType.STRING)}
    path = write_tiny_model(tmp_path / "m.gguf", "llama", extra_kv=scaling)
    with pytest.raises(ModelError, match=r"rope\.scaling\.type.*'longrope'.*supported: none, linear, llama3, yarn"):
        _load(path)
    # YaRN only where the architecture builds it (llama, qwen2, qwen3, phi3, gpt-oss)
    scaling = {"gemma3.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING)}
    path = write_tiny_model(tmp_path / "g.gguf", "gemma3", extra_kv=scaling)
    with pytest.raises(ModelError, match=r"rope\.scaling\.type.*'yarn'.*supported: none, linear, llama3$"):
        _load(path)


@pytest.mark.parametrize("key,value,why", [
    ("rope.scaling.original_context_length", (0, gguf.GGUFValueType.UINT32), r"must be in \[1, "),
    ("rope.scaling.attn_factor", (float("nan"), gguf.GGUFValueType.FLOAT32), "must be finite and > 0"),
    ("rope.scaling.yarn_beta_fast", (-1.0, gguf.GGUFValueType.FLOAT32), "must be finite and > 0"),
    ("rope.scaling.yarn_log_multiplier", (0.1, gguf.GGUFValueType.FLOAT32), "DeepSeek"),
])
def test_bad_yarn_metadata(tmp_path, key, value, why):
    kv = {"llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING), f"llama.{key}": value}
    path = write_tiny_model(tmp_path / "m.gguf", "llama", extra_kv=kv)
    with pytest.raises(ModelError, match=rf"llama\.{key} = .*{why}"):
        _load(path)


def test_bad_head_counts(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "llama", n_kv_heads=3)
    with pytest.raises(ModelError, match=r"llama\.attention\.head_count_kv = 3: must divide llama\.attention\.head_count = 4"):
        _load(path)


def test_unsupported_weight_type_fails_at_load(tmp_path):
    """A backend without a kernel for a weight's type is refused when the model loads."""
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType as T

    def check_supported(qtype):
        if qtype == T.Q6_K:
            raise ValueError("no kernel for Q6_K")

    ops = SimpleNamespace(**{k: getattr(numpy_ops, k) for k in ("matmul", "embed")}, check_supported=check_supported)
    path = write_tiny_model(tmp_path / "m.gguf", "llama")
    with pytest.raises(ModelError, match=r"tensor 'blk\.0\.ffn_down\.weight': no kernel for Q6_K"):
        load_model(load_gguf(path), ops)
