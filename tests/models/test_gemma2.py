"""Gemma 2 beyond the shared tiny-model checks (tests/models/test_tiny_models.py): each of its
features (attention softcap, final softcap, sliding window on even layers) changes the logits and
edged follows the float64 reference with it; llama.cpp's defaults and the 27B query scale; the
gemma chat template and turn tokens through the loader and the engine."""

import math

import numpy as np
import pytest

import tests.helpers.numpy_ops as numpy_ops
from edged.chat_limits import ChatTemplateError
from edged.engine.engine import Engine, EngineConfig
from edged.loader import load
from edged.models import load_model
from edged.sampling import SamplingParams
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy
from tests.models.tiny_checks import TinyCase, check, prefill

NO_CAP = 1e30  # cap * tanh(x / cap) == x for these logits: the feature switched off


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return TinyCase(write_tiny_model(tmp_path_factory.mktemp("g2") / "base.gguf", "gemma2"))


@pytest.mark.parametrize("change", [dict(attn_softcap=NO_CAP), dict(final_softcap=NO_CAP),
                                    dict(sliding_window=0)], ids=["attn_softcap", "final_softcap", "window"])
def test_each_feature_changes_the_logits_and_edged_follows(tmp_path, base, change):
    # 13 tokens > window 4; the tiny logits (attention up to ~0.7, final up to ~1.7) pass the caps 0.5 / 1.0
    other = TinyCase(write_tiny_model(tmp_path / "m.gguf", "gemma2", **change))
    scale = np.abs(base.ref_logits).max()
    assert np.abs(other.ref_logits - base.ref_logits).max() > 0.05 * scale
    check(other, "numpy", prefill, 16)  # within 1e-4 of its own reference, so not of the base's


def test_loaded_geometry_and_defaults(tmp_path, base):
    m = base.model("numpy")
    assert [m.layer_window(i) for i in range(4)] == [4, 0, 4, 0]  # llama.cpp set_swa_pattern(2)
    assert (m.attn_softcap, m.final_softcap) == (0.5, 1.0)
    assert m.attn_scale == pytest.approx(1 / math.sqrt(32)) and m.embed_scale == np.float32(8.0)
    lw = m.layers[1]
    assert lw.attn.q_norm is None and lw.post_attn_norm is not None and lw.post_ffn_norm is not None
    assert lw.rope.neox and lw.rope is m.layers[0].rope and m.output is m.token_embd
    # keys absent: llama.cpp's 50 / 30 caps and 4096 window (here capped at the 256 context)
    bare = TinyCase(write_tiny_model(tmp_path / "bare.gguf", "gemma2", sliding_window=0,
                                     attn_softcap=None, final_softcap=None)).model("numpy")
    assert (bare.attn_softcap, bare.final_softcap) == (50.0, 30.0)
    assert [bare.layer_window(i) for i in range(4)] == [256, 0, 256, 0]


def test_27b_query_scale(tmp_path):
    """46 blocks is the 27B: query scaled by 1/sqrt(n_embd / n_heads), not 1/sqrt(head_dim)."""
    m = TinyCase(write_tiny_model(tmp_path / "m.gguf", "gemma2", n_layers=46), n_tokens=2).model("numpy")
    assert m.attn_scale == pytest.approx(1 / math.sqrt(64 // 4))


def test_chat_template_and_turn_tokens_through_loader_and_engine(tmp_path):
    lm = load(str(write_tiny_model(tmp_path / "m.gguf", "gemma2")), warmup=False, quiet=True)
    conv = [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "the capital"}]
    prompt = lm.chat.render(conv)
    assert lm.chat.name == "gguf"
    assert prompt == ("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\na<end_of_turn>\n"
                      "<start_of_turn>user\nthe capital<end_of_turn>\n<start_of_turn>model\n")  # BOS: the tokenizer's
    ids = lm.tokenizer.encode(prompt)
    start, end = (lm.tokenizer.vocab.tokens.index(t) for t in ("<start_of_turn>", "<end_of_turn>"))
    assert ids[0] == 2 and ids.count(start) == 4 and ids.count(end) == 3  # <bos>, then whole turn tokens
    assert lm.tokenizer.is_eog(end) and lm.tokenizer.decode(ids[1:], skip_special=False) == prompt
    with pytest.raises(ChatTemplateError, match="System role not supported"):  # the model's own template
        lm.chat.render([{"role": "system", "content": "x"}, *conv])
    model = load_model(lm.gguf, numpy_ops)  # the engine over the numpy ops: no kernel compiles
    engine = Engine(model, lm.tokenizer, EngineConfig(num_blocks=64, block_size=4)).start()
    try:
        deltas = engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    finally:
        engine.stop()
    assert [d.token_id for d in deltas if d.token_id is not None] == greedy(model, ids, 6).ids
