"""Batch invariance and preemption on the default model: 16 mixed requests in one engine give the
same greedy tokens as each alone, and a tiny pool that forces preemption changes nothing."""

import numpy as np
import pytest

from edged.engine.engine import Engine, EngineConfig
from edged.models import load_model
from edged.quant import load_gguf
from edged.tokenizer import Tokenizer
from tests.engine.engine_helpers import greedy, token_ids
from tests.helpers.model import default_model_path


@pytest.fixture(scope="module")
def gemma():
    gf = load_gguf(default_model_path())
    return load_model(gf), Tokenizer.from_gguf(gf)


def _ids(deltas):
    return token_ids(deltas, finish="length")


def test_sixteen_mixed_requests_equal_alone(gemma):
    model, tok = gemma
    rng = np.random.default_rng(5)
    texts = ["The capital of France is", "def fib(n):", "日本語のテキスト", "Once upon a time"]
    prompts = [tok.encode(texts[i % 4] + " " * (i // 4), add_special=True) for i in range(8)]
    prompts += [[2] + rng.integers(200, 20000, size=int(rng.integers(3, 90))).tolist() for _ in range(8)]
    eng = Engine(model, tok, EngineConfig(num_blocks=256, block_size=16, max_batch_tokens=256,
                                          max_seqs=16)).start()
    try:
        alone = [_ids(eng.generate(p, greedy(6))) for p in prompts]
        together = [_ids(list(s)) for s in [eng.add_request(p, greedy(6)) for p in prompts]]
        assert together == alone
        st = eng.stats()
        assert st.blocks_free == st.blocks_total
    finally:
        eng.stop()


def test_preemption_on_default_model_changes_nothing(gemma):
    model, tok = gemma
    rng = np.random.default_rng(6)
    prompts = [[2] + rng.integers(200, 20000, size=40).tolist() for _ in range(4)]
    big = Engine(model, tok, EngineConfig(num_blocks=64, block_size=16, max_seqs=4)).start()
    small = Engine(model, tok, EngineConfig(num_blocks=7, block_size=16, max_batch_tokens=64,
                                            max_seqs=4)).start()
    try:
        ref = [_ids(big.generate(p, greedy(12))) for p in prompts]
        got = [_ids(list(s)) for s in [small.add_request(p, greedy(12)) for p in prompts]]
        assert got == ref
        assert small.stats().preemptions > 0
    finally:
        big.stop()
        small.stop()


def test_long_prompt_same_with_and_without_freeing_window_blocks(gemma):
    # 900 prompt tokens in 256-token chunks: after the third chunk the sliding layers' first 16
    # blocks are freed, and the last chunk reads only the blocks of its window
    model, tok = gemma
    rng = np.random.default_rng(7)
    prompt = [2] + rng.integers(200, 20000, size=900).tolist()
    on = Engine(model, tok, EngineConfig(num_blocks=64, block_size=16, max_batch_tokens=256,
                                         max_seqs=1)).start()
    off = Engine(model, tok, EngineConfig(num_blocks=64, block_size=16, max_batch_tokens=256,
                                          max_seqs=1, free_window_blocks=False)).start()
    try:
        assert on.window_pool is not None and off.window_pool is None
        assert _ids(on.generate(prompt, greedy(8))) == _ids(off.generate(prompt, greedy(8)))
        st = on.stats()
        assert st.blocks_free == st.blocks_total and st.window_blocks_free == st.window_blocks_total
    finally:
        on.stop()
        off.stop()
