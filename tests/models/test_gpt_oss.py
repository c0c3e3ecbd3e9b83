"""gpt-oss beyond the shared tiny-model checks (tests/models/test_tiny_models.py runs its prefill,
paged decode and mixed batches against the float64 reference): that the sinks, the sliding window,
YaRN and the expert biases each move the reference's logits far beyond the bound edged is held to
(so matching the reference means edged applies them), and bad files."""

import gguf
import numpy as np
import pytest

from edged.models import ModelError, load_model
from edged.quant import load_gguf
from edged.quant.errors import GGUFError
from tests.helpers.tiny_models import write_tiny_model
from tests.models.reference import ReferenceModel
from tests.models.tiny_checks import TOLERANCE

TOKENS = [int(t) for t in np.random.default_rng(0).integers(0, 300, 13)]  # longer than the window of 4


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("gpt-oss") / "m.gguf", "gpt-oss")


def _moved(ref: ReferenceModel, base: np.ndarray) -> float:
    return float(np.abs(ref.logits(TOKENS) - base).max() / np.abs(base).max())


@pytest.mark.parametrize("change", ["no_sinks", "no_window", "no_yarn", "no_expert_biases"])
def test_each_part_matters(path, change):
    ref = ReferenceModel(path)
    base = ref.logits(TOKENS)
    meta = f"{ref.arch}."
    if change == "no_sinks":
        for il in range(2):
            ref.w[f"blk.{il}.attn_sinks.weight"] = np.full(4, -np.inf)  # e^-inf: nothing in the denominator
    elif change == "no_window":
        ref.meta[meta + "attention.sliding_window"] = 10_000
    elif change == "no_yarn":
        ref.meta[meta + "rope.scaling.type"] = "none"
    else:
        for il in range(2):
            for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_inp"):
                ref.w[f"blk.{il}.{name}.bias"] = np.zeros_like(ref.w[f"blk.{il}.{name}.bias"])
    assert _moved(ref, base) > 100 * TOLERANCE["numpy"]


def _load(p):
    return load_model(load_gguf(p))


@pytest.mark.parametrize("omit", ["blk.1.attn_sinks.weight", "blk.0.attn_output.bias", "output.weight",
                                  "blk.0.ffn_up_exps.bias", "blk.1.ffn_gate_inp.bias", "blk.0.post_attention_norm.weight"])
def test_missing_tensor_is_named(tmp_path, omit):
    with pytest.raises(ModelError, match=rf"missing tensor '{omit}'"):
        _load(write_tiny_model(tmp_path / "m.gguf", "gpt-oss", omit=(omit,)))


def test_bad_metadata(tmp_path):
    with pytest.raises(GGUFError, match=r"gpt-oss\.attention\.sliding_window: required key is missing"):
        _load(write_tiny_model(tmp_path / "a.gguf", "gpt-oss", sliding_window=0))  # the key absent
    window = {"gpt-oss.attention.sliding_window": (1000, gguf.GGUFValueType.UINT32)}
    with pytest.raises(ModelError, match=r"gpt-oss\.attention\.sliding_window = 1000: must be in \[1, 256\]"):
        _load(write_tiny_model(tmp_path / "b.gguf", "gpt-oss", extra_kv=window))
    used = {"gpt-oss.expert_used_count": (9, gguf.GGUFValueType.UINT32)}
    with pytest.raises(ModelError, match=r"gpt-oss\.expert_used_count = 9"):
        _load(write_tiny_model(tmp_path / "c.gguf", "gpt-oss", extra_kv=used))


def test_window_pattern_and_swa_base(tmp_path):
    kv = {"gpt-oss.attention.sliding_window_pattern": (3, gguf.GGUFValueType.UINT32),
          "gpt-oss.rope.freq_base_swa": (10000.0, gguf.GGUFValueType.FLOAT32)}
    model = _load(write_tiny_model(tmp_path / "m.gguf", "gpt-oss", n_layers=3, extra_kv=kv))
    assert [model.layer_window(i) for i in range(3)] == [4, 4, 0]
    assert [lw.rope.freq_base for lw in model.layers] == [10000.0, 10000.0, 150000.0]
