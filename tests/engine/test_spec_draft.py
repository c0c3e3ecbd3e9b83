"""Speculation with a draft model (edged.engine.spec_draft): the proposer's drafts are the draft
model's greedy continuation whatever it kept from earlier proposals, its pool and p_min limits, the
vocabulary check, and the engine with a draft against the engine without one (greedy tokens
identical, drafts accepted and rejected, every block back)."""

import numpy as np
import pytest

from edged.engine import spec_draft
from edged.engine.engine import Engine, EngineConfig
from edged.engine.spec_draft import DraftModelProposer, VocabularyMismatch, check_same_vocabulary
from edged.sampling import SamplingParams
from tests.engine.engine_helpers import (assert_all_blocks_free, greedy, load_tiny, random_prompts,
                                         start_engine, token_ids)


@pytest.fixture(scope="module", params=["llama", "gemma3"])  # gemma3: sliding-window layers too
def pair(request, tmp_path_factory):
    """(target, draft): two tiny random models of one architecture and vocabulary, the draft with
    other weights and one layer."""
    d = tmp_path_factory.mktemp("pair")
    (d / "t").mkdir()
    (d / "d").mkdir()
    return load_tiny(d / "t", request.param), load_tiny(d / "d", request.param, seed=1, n_layers=1)


def _greedy_continuation(model, tokens: list[int], k: int) -> list[int]:
    """The model's k greedy tokens after `tokens`, each from a fresh full pass (no KV reuse)."""
    out = list(tokens)
    for _ in range(k):
        p = DraftModelProposer(model, 1, pool_tokens=len(out) + 1, block_size=4, p_min=0.0)
        out += p.propose("x", out, 1)
    return out[len(tokens):]


def test_drafts_are_the_draft_models_greedy_tokens_after_rejections(pair):
    (_, _), (draft, _) = pair
    prop = DraftModelProposer(draft, 5, pool_tokens=256, block_size=4, p_min=0.0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, draft.vocab_size, size=11).tolist()
    for step in range(6):
        drafts = prop.propose("r", tokens, 5)
        assert drafts == _greedy_continuation(draft, tokens, 5), step
        # the target accepts j of them and then samples a token of its own (or the next draft)
        j = int(rng.integers(0, 6))
        tokens = tokens + drafts[:j] + [int(rng.integers(4, draft.vocab_size))]
    assert prop.passes < 6 * 5 + 6  # the catch-up reads the new tokens in one pass


def test_batched_proposals_equal_single_ones_in_fewer_passes(pair, monkeypatch):
    (_, _), (draft, _) = pair
    monkeypatch.setattr(spec_draft, "CATCH_UP_CHUNK", 7)  # a 20-token context takes three catch-up passes
    rng = np.random.default_rng(1)
    batched = DraftModelProposer(draft, 4, pool_tokens=1024, block_size=4, p_min=0.0)
    single = DraftModelProposer(draft, 4, pool_tokens=1024, block_size=4, p_min=0.0)
    contexts = {f"r{i}": rng.integers(4, draft.vocab_size, size=int(n)).tolist() for i, n in enumerate((3, 9, 20))}
    for step in range(4):
        items = [(rid, ctx, k) for (rid, ctx), k in zip(contexts.items(), (4, 1, 3))]
        p0, s0 = batched.passes, single.passes
        got = batched.propose_batch(items)
        assert got == [single.propose(*it) for it in items], step
        assert batched.passes - p0 < single.passes - s0
        for (rid, ctx), d in zip(contexts.items(), got):  # half the drafts accepted, then a token of its own
            contexts[rid] = ctx + d[: len(d) // 2] + [int(rng.integers(4, draft.vocab_size))]


@pytest.mark.parametrize("p_min, drafts", [(0.0, [4, 5, 6, 7]), (0.85, [4, 5, 6, 7]), (0.95, [])])
def test_p_min_stops_the_draft(p_min, drafts):
    prop = DraftModelProposer(_PeakedStub(vocab=12, peak=0.9), 4, pool_tokens=64, block_size=4, p_min=p_min)
    assert prop.propose("r", [1, 2, 3], 4) == drafts


class _PeakedStub:
    """A draft whose next token is last + 1 with probability `peak`; forward records nothing in KV."""

    def __init__(self, vocab: int, peak: float, context_length: int = 64):
        self.vocab_size, self.context_length = vocab, context_length
        self._logit = float(np.log(peak * (vocab - 1) / (1.0 - peak)))  # softmax gives `peak`

    def allocate_kv(self, num_blocks, block_size):
        return []

    def forward(self, batch, kv):
        last = int(batch.token_ids[batch.logits_indices[0]])
        row = np.zeros((1, self.vocab_size), np.float32)
        row[0, (last + 1) % self.vocab_size] = self._logit
        return row


def test_a_short_pool_drafts_nothing_and_gives_its_blocks_back():
    model = _PeakedStub(vocab=12, peak=0.9)
    prop = DraftModelProposer(model, 4, pool_tokens=8, block_size=4, p_min=0.0)
    assert prop.propose("a", [1, 2, 3], 4) == [4, 5, 6, 7]  # 3 + 3 positions: both blocks
    assert prop.propose("b", [1, 2], 2) == []  # none left
    prop.release("a")
    assert prop.propose("b", [1, 2], 2) == [3, 4]
    assert prop.propose("c", list(range(9)), 1) == []  # more than the whole pool


def test_no_draft_past_the_draft_models_context():
    prop = DraftModelProposer(_PeakedStub(vocab=12, peak=0.9, context_length=6), 4, pool_tokens=64,
                              block_size=4, p_min=0.0)
    assert prop.propose("r", [1, 2, 3, 4], 4) == [5, 6]
    assert prop.propose("s", [1, 2, 3, 4, 5, 6], 4) == []


def test_vocabulary_check(pair, tmp_path):
    (_, tok), (_, draft_tok) = pair
    check_same_vocabulary(tok, draft_tok)  # same tiny vocabulary, other weights
    other = load_tiny(tmp_path, "qwen2")[1]  # a byte-level BPE vocabulary
    with pytest.raises(VocabularyMismatch):
        check_same_vocabulary(tok, other)


def test_engine_config_needs_a_draft_model_for_draft_and_only_then(pair):
    (model, tok), (draft, _) = pair
    cfg = EngineConfig(num_blocks=64, block_size=4, spec="draft")
    with pytest.raises(ValueError, match="draft"):
        Engine(model, tok, cfg)
    with pytest.raises(ValueError, match="draft"):
        Engine(model, tok, EngineConfig(num_blocks=64, block_size=4, spec="ngram"), draft=draft)


def _start(pair, draft, **cfg) -> Engine:
    (model, tok), _ = pair
    config = EngineConfig(num_blocks=256, block_size=4, max_batch_tokens=64, max_seqs=16, spec="draft",
                          spec_p_min=0.0, **cfg)
    return Engine(model, tok, config, draft=draft).start()


class _SometimesWrong:
    """The target as its own draft, but its logits shifted by one token after every third position:
    drafts that are partly accepted (two random models' greedy tokens never agree)."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def forward(self, batch, kv):
        logits = self._model.forward(batch, kv)  # [1, vocab]
        return np.roll(logits, 1, axis=1) if batch.positions[batch.logits_indices[0]] % 3 == 0 else logits


def test_greedy_tokens_identical_with_a_draft_model(pair):
    (model, _), _ = pair
    draft = _SometimesWrong(model)
    prompts = random_prompts(model.vocab_size, 8, seed=3)
    params = [greedy(20), greedy(3), SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True,
                                                    speculative=False), greedy(9)] * 2
    plain = start_engine(pair[0])
    other, itself = _start(pair, draft, spec_max=4), _start(pair, model, spec_max=6)
    try:
        ref = [token_ids(plain.generate(p, q)) for p, q in zip(prompts, params)]
        for spec in (other, itself):
            streams = [spec.add_request(p, q) for p, q in zip(prompts, params)]
            assert [token_ids(list(s)) for s in streams] == ref
            assert_all_blocks_free(spec)
        a, b = other.stats(), itself.stats()
        assert 0 < a.spec_accepted_tokens < a.spec_draft_tokens  # some rejected
        assert b.spec_draft_tokens > 0 and b.spec_accepted_tokens == b.spec_draft_tokens  # itself: all kept
        assert not other.spec._seqs and not itself.spec._seqs  # every sequence's draft state released
    finally:
        plain.stop()
        other.stop()
        itself.stop()


class _BreaksAfter:
    """A draft model whose forward raises from its n-th pass on (a device fault, say)."""

    def __init__(self, model, n):
        self._model, self._left = model, n

    def __getattr__(self, name):
        return getattr(self._model, name)

    def forward(self, batch, kv):
        self._left -= 1
        if self._left < 0:
            raise RuntimeError("the draft's device went away")
        return self._model.forward(batch, kv)


def test_a_failing_draft_model_leaves_the_requests_unharmed(pair, caplog):
    (model, _), _ = pair
    prompts = random_prompts(model.vocab_size, 4, seed=5)
    plain = start_engine(pair[0])
    spec = _start(pair, _BreaksAfter(model, 3), spec_max=4)
    try:
        ref = [token_ids(plain.generate(p, greedy(12))) for p in prompts]
        with caplog.at_level("ERROR", logger="edged.engine"):
            streams = [spec.add_request(p, greedy(12)) for p in prompts]
            assert [token_ids(list(s)) for s in streams] == ref
        assert "speculative decoding failed" in caplog.text
        assert spec.spec is None and spec.governor is None  # it went on without drafts
        assert token_ids(spec.generate(prompts[0], greedy(12))) == ref[0]
        assert_all_blocks_free(spec)
    finally:
        plain.stop()
        spec.stop()
