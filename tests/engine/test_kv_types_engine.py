"""The engine over f32, f16 and q8_0 KV caches (tiny Gemma 3: a full-attention and a
sliding-window KV group): greedy tokens equal a step-by-step forward over a cache of the same
type, are the same alone and in a batch, and the pools hold the type's bytes."""

import pytest

from edged.backends.base import kv_row_bytes
from edged.engine.sizing import plan_kv
from tests.engine.engine_helpers import (assert_all_blocks_free, greedy, load_tiny, random_prompts,
                                         start_engine, token_ids)
from tests.models.driver import greedy as forward_greedy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("m"), "gemma3")


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_greedy_with_each_kv_type(tiny, kv_type):
    model, _ = tiny
    model.kv_type = kv_type
    try:
        prompts = random_prompts(model.vocab_size, n=6, seed=3)
        eng = start_engine(tiny)
        try:
            alone = [token_ids(eng.generate(p, greedy(8))) for p in prompts]
            together = [token_ids(list(s)) for s in [eng.add_request(p, greedy(8)) for p in prompts]]
            st = eng.stats()
            assert_all_blocks_free(eng)
        finally:
            eng.stop()
        assert together == alone
        assert alone[0] == forward_greedy(model, prompts[0], 8, block_size=4).ids
        assert alone[1] == forward_greedy(model, prompts[1], 8, block_size=4).ids
        assert st.kv_type == kv_type
        row = 2 * model.n_kv_heads * kv_row_bytes(kv_type, model.head_dim)  # K and V, one layer
        n_sliding = sum(1 for i in range(model.n_layers) if model.layer_window(i))
        assert st.kv_bytes_total == 4 * row * (st.blocks_total * (model.n_layers - n_sliding)
                                               + st.window_blocks_total * n_sliding)
    finally:
        model.kv_type = "f32"


def test_kv_bytes_per_token_by_type(tiny):
    model, _ = tiny
    assert model.kv_type == "f32"  # a model built directly; edged.loader.load sets --kv-type's (f16)
    assert 2 * model.kv_bytes_per_token(kv_type="f16") == model.kv_bytes_per_token()
    assert 128 * model.kv_bytes_per_token(kv_type="q8_0") == 34 * model.kv_bytes_per_token(kv_type="f32")
    with pytest.raises(ValueError, match="--kv-type"):
        model.kv_type = "q4_0"
    # the KV pool's log line (edged serve's start) names the type and its MiB
    f16, f32 = (plan_kv(model, 4, ctx=64, max_seqs=2, kv_type=t) for t in ("f16", "f32"))
    assert f16.describe().startswith("f16 K/V, ") and 2 * f16.nbytes == f32.nbytes
