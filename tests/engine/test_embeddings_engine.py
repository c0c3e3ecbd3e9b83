"""Embedding requests in the engine (issue 16 item 1): prefill-only, pooled from the final-normed
hidden states (mean, last, cls) in the same steps as generations, KV freed and never cached."""

import numpy as np
import pytest

from edged.engine.pooling import normalize, pooling_for
from edged.models import load_model
from edged.quant import load_gguf
from edged.quant.dequant import dequantize
from edged.tokenizer import Tokenizer
from tests.engine.engine_helpers import assert_all_blocks_free, greedy, start_engine, token_ids
from tests.models.driver import Seq, ShuffledBlocks, make_batch
from tests.models.reference import ReferenceModel
from tests.helpers.tiny_models import write_tiny_model

PROMPTS = [list(range(5, 42)), list(range(90, 99)), [7]]  # 37 tokens (3 chunks of 16), 9, 1


class HiddenReference(ReferenceModel):
    """The float64 reference forward, stopped after the final norm (before the output projection)."""

    def output(self, x):
        return self.norm(x, "output_norm.weight")


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def tiny_path(request, tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "m.gguf", request.param)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    gf = load_gguf(tiny_path)
    return load_model(gf), Tokenizer.from_gguf(gf)


def all_hidden(model, prompt) -> np.ndarray:
    """float32 [len(prompt), n_embd]: forward_hidden of every row of one sequence."""
    nb = -(-len(prompt) // 4)
    kv = model.allocate_kv(nb, 4)
    batch = make_batch([Seq()], [prompt], ShuffledBlocks(nb), 4)
    logits, hidden = model.forward_hidden(batch, kv, np.arange(len(prompt), dtype=np.int32))
    assert logits.shape == (1, model.vocab_size)
    return hidden


def numpy_pool(hidden: np.ndarray, mode: str) -> np.ndarray:
    return {"mean": hidden.astype(np.float64).mean(axis=0), "last": hidden[-1], "cls": hidden[0]}[mode]


def test_hidden_rows_are_the_final_normed_states(tiny, tiny_path):
    """Against the independent float64 forward, and projected by the output weights they give the
    logits forward returns for the same rows."""
    model, _ = tiny
    prompt = PROMPTS[1]
    hidden = all_hidden(model, prompt)
    ref = HiddenReference(tiny_path).logits(prompt)  # [9, n_embd]
    assert np.abs(hidden - ref).max() / np.abs(ref).max() <= 0.1  # the CPU backend's bound
    nb = 3
    kv = model.allocate_kv(nb, 4)
    logits = model.forward(make_batch([Seq()], [prompt], ShuffledBlocks(nb), 4, all_logits=True), kv)
    w = dequantize(model.output).reshape(model.vocab_size, -1).astype(np.float64)
    projected = hidden.astype(np.float64) @ w.T
    if model.final_softcap:
        projected = np.tanh(projected / model.final_softcap) * model.final_softcap
    assert np.abs(projected - logits).max() / np.abs(logits).max() <= 0.05  # int8 activations


@pytest.mark.parametrize("mode", ["mean", "last", "cls"])
def test_pooling_modes_match_numpy(tiny, mode):
    model, _ = tiny
    eng = start_engine(tiny, max_batch_tokens=16)
    try:
        streams = [eng.add_embedding(p, mode) for p in PROMPTS]  # batched, chunked
        for p, s in zip(PROMPTS, streams):
            (d,) = list(s)
            assert d.finish_reason == "stop" and d.token_id is None and d.num_prompt_tokens == len(p)
            assert d.embedding.dtype == np.float32 and d.embedding.shape == (model.hparams.n_embd,)
            np.testing.assert_allclose(d.embedding, numpy_pool(all_hidden(model, p), mode), rtol=1e-5,
                                       atol=1e-6)
        st = eng.stats()
        assert st.embedding_inputs == 3 and st.embedding_tokens == sum(map(len, PROMPTS))
        assert_all_blocks_free(eng)
        assert st.blocks_cached_free == 0  # an embedding's blocks never enter the prefix cache
    finally:
        eng.stop()


def test_batched_with_generation(tiny):
    """Embeddings sharing steps with generations: the generated tokens are those of the generation
    alone, and the embeddings those of an engine that ran nothing else."""
    model, _ = tiny
    eng = start_engine(tiny, max_batch_tokens=16)
    try:
        gen_prompts = [list(range(50, 70)), list(range(120, 125))]
        alone = [token_ids(eng.generate(p, greedy(10))) for p in gen_prompts]
        solo = [list(eng.add_embedding(p, "mean"))[0].embedding for p in PROMPTS]
        gens = [eng.add_request(p, greedy(10)) for p in gen_prompts]
        embs = [eng.add_embedding(p, "mean") for p in PROMPTS * 3]
        assert [token_ids(list(s)) for s in gens] == alone
        for i, s in enumerate(embs):
            np.testing.assert_array_equal(list(s)[0].embedding, solo[i % 3])
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_preempted_embedding_starts_over(tiny):
    big = start_engine(tiny, max_batch_tokens=16)
    small = start_engine(tiny, num_blocks=14, max_batch_tokens=8)  # 56 slots for 37 + 9 + 20 x 2
    try:
        want = [list(big.add_embedding(p, "mean"))[0].embedding for p in PROMPTS]
        gens = [small.add_request(list(range(60, 80)), greedy(16)) for _ in range(2)]
        embs = [small.add_embedding(p, "mean") for p in PROMPTS]
        for s, w in zip(embs, want):
            np.testing.assert_array_equal(list(s)[0].embedding, w)
        assert all(len(token_ids(list(g))) == 16 for g in gens)
        assert small.stats().preemptions > 0
        assert_all_blocks_free(small)
    finally:
        big.stop()
        small.stop()


def test_abort_and_bad_requests(tiny):
    eng = start_engine(tiny, num_blocks=8, max_seqs=1)
    try:
        with pytest.raises(ValueError, match="pooling must be one of"):
            eng.add_embedding([5, 6], "max")
        with pytest.raises(ValueError, match="exceeds"):
            eng.add_embedding(list(range(5, 40)), "mean")
        with pytest.raises(ValueError, match="outside the vocabulary"):
            eng.add_embedding([tiny[0].vocab_size], "mean")
        busy = eng.add_request(list(range(5, 9)), greedy(20))
        queued = eng.add_embedding([5, 6, 7], "last")
        eng.abort(queued.request_id)
        assert [d.finish_reason for d in queued] == ["abort"]
        assert len(token_ids(list(busy))) == 20
        assert_all_blocks_free(eng)
    finally:
        eng.stop()


def test_normalize_and_dimensions():
    v = np.array([3.0, 4.0, 12.0], dtype=np.float32)
    np.testing.assert_allclose(normalize(v), v / 13.0, rtol=1e-7)
    np.testing.assert_allclose(normalize(v, 2), [0.6, 0.8], rtol=1e-7)  # truncate, then renormalise
    assert normalize(np.zeros(4, np.float32)).tolist() == [0.0] * 4
    assert normalize(v).dtype == np.float32


def test_pooling_choice():
    assert pooling_for(None, None) == "mean"
    assert pooling_for(3, None) == "last" and pooling_for(2, None) == "cls" and pooling_for(1, None) == "mean"
    assert pooling_for(0, "cls") == "cls"  # --pooling overrides the file
    with pytest.raises(ValueError, match="pooling_type is 'none'.*--pooling"):
        pooling_for(0, None)
    with pytest.raises(ValueError, match="'rank'"):
        pooling_for(4, None)
    with pytest.raises(ValueError, match="--pooling must be one of"):
        pooling_for(None, "max")
