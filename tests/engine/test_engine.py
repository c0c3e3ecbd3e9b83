"""Engine end to end on tiny random models: batch invariance, preemption, prefix cache, abort."""

import numpy as np
import pytest

from edged.engine.engine import Engine, EngineConfig
from edged.models import load_model
from edged.quant import load_gguf
from edged.sampling import SamplingParams
from edged.tokenizer import Tokenizer
from tests.helpers.tiny_models import write_tiny_model


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def tiny(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("m") / "m.gguf", request.param)
    gf = load_gguf(path)
    return load_model(gf), Tokenizer.from_gguf(gf)


def _engine(tiny, **cfg):
    model, tok = tiny
    config = EngineConfig(**{"num_blocks": 256, "block_size": 4, "max_batch_tokens": 64,
                             "max_seqs": 16, **cfg})
    return Engine(model, tok, config).start()


def _params(n=6, **kw):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def _ids(deltas):
    assert deltas[-1].finish_reason is not None
    return [d.token_id for d in deltas if d.token_id is not None]


def _prompts(vocab, n=16, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(4, vocab, size=int(rng.integers(1, 40))).tolist() for _ in range(n)]


def _assert_pool_clean(engine):
    st = engine.stats()
    assert st.running == 0 and st.waiting == 0
    assert st.blocks_free == st.blocks_total  # every block is free (cached ones included)


def test_batch_invariance_16_mixed_requests(tiny):
    prompts = _prompts(tiny[0].vocab_size)
    eng = _engine(tiny)
    try:
        alone = [_ids(eng.generate(p, _params())) for p in prompts]
        streams = [eng.add_request(p, _params()) for p in prompts]
        together = [_ids(list(s)) for s in streams]
        assert together == alone
        assert eng.stats().steps > 0
        _assert_pool_clean(eng)
    finally:
        eng.stop()


def test_preemption_gives_identical_greedy_outputs(tiny):
    prompts = _prompts(tiny[0].vocab_size, n=6, seed=1)
    big = _engine(tiny)
    small = _engine(tiny, num_blocks=24, max_batch_tokens=16)  # 96 token slots for 6 x (<=40+12)
    try:
        ref = [_ids(big.generate(p, _params(12))) for p in prompts]
        streams = [small.add_request(p, _params(12)) for p in prompts]
        got = [_ids(list(s)) for s in streams]
        assert got == ref
        assert small.stats().preemptions > 0
        _assert_pool_clean(small)
    finally:
        big.stop()
        small.stop()


def test_prefix_hit_same_output(tiny):
    eng = _engine(tiny)
    try:
        prefix = list(range(5, 37))  # 8 full blocks of 4
        a = _ids(eng.generate(prefix + [40, 41], _params()))
        hits0 = eng.kv.prefix_hits
        b = _ids(eng.generate(prefix + [40, 41], _params()))
        assert eng.kv.prefix_hits - hits0 == 32
        assert a == b
        _assert_pool_clean(eng)
    finally:
        eng.stop()


def test_abort_queued_and_running_frees_everything(tiny):
    eng = _engine(tiny, max_seqs=1)
    try:
        running = eng.add_request(list(range(5, 30)), _params(10_000 // 100))
        queued = eng.add_request(list(range(5, 9)), _params(5))
        eng.abort(queued.request_id)
        eng.abort(running.request_id)
        assert list(queued)[-1].finish_reason == "abort"
        assert list(running)[-1].finish_reason in ("abort", "length")
        _assert_pool_clean(eng)
    finally:
        eng.stop()


def test_bad_requests_rejected_before_queueing(tiny):
    eng = _engine(tiny, num_blocks=8)
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            eng.add_request([tiny[0].vocab_size], _params())
        with pytest.raises(ValueError, match="exceeds"):
            eng.add_request(list(range(5, 35)), _params(10))
        assert len(_ids(eng.generate([5, 6], _params(3)))) == 3  # still serving
    finally:
        eng.stop()
