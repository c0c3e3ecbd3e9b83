"""N-gram speculative decoding (edged.engine.spec_ngram): the proposer against a brute-force
search, and the engine with --spec against the engine without it: greedy tokens and deltas
identical (mixed batches, stops inside drafts, preemption, prefix cache), sampled tokens
distributed as without drafts (an exact-probability chi-square) and repeated under a seed."""

import math

import numpy as np
import pytest

from edged.engine.request import Request
from edged.engine.spec_ngram import NgramIndex, NgramProposer, draft_room
from edged.sampling import SamplingParams
from tests.engine.engine_helpers import (assert_all_blocks_free, assert_preempted_equal, greedy,
                                         load_tiny, random_prompts, start_engine, token_ids)
from tests.server.stub_model import StubModel

# -- the proposer -----------------------------------------------------------------------------


def _brute_draft(tokens: list[int], k: int, max_n: int = 3) -> list[int]:
    """The longest suffix n-gram's latest earlier occurrence, by scanning every position."""
    size = len(tokens)
    for n in range(min(max_n, size), 0, -1):
        suffix = tokens[size - n :]
        for e in range(size - 1, n - 1, -1):  # n-gram tokens[e-n:e], followed by tokens[e]
            if tokens[e - n : e] == suffix:
                return tokens[e : e + k]
    return []


def test_longest_match_first():
    # "7 8 9" occurs once, followed by 1; "9" alone occurs later, followed by 2
    tokens = [7, 8, 9, 1, 5, 9, 2, 6, 7, 8, 9]
    assert NgramIndex(20).lookup(tokens, 3) == [1, 5, 9]


def test_most_recent_occurrence():
    tokens = [1, 2, 3, 10, 4, 1, 2, 3, 11, 12, 5, 1, 2, 3]
    assert NgramIndex(20).lookup(tokens, 2) == [11, 12]


def test_no_earlier_occurrence_is_empty():
    idx = NgramIndex(20)
    assert idx.lookup([1, 2, 3, 4], 5) == []
    assert idx.lookup([5], 5) == []
    assert NgramProposer(20).propose("r", [1, 2, 1], 0) == []


def test_draft_stops_at_the_context_end_and_spec_max():
    assert NgramIndex(20).lookup([4, 5, 6, 4, 5], 8) == [6, 4, 5]
    assert NgramProposer(20, spec_max=1).propose("r", [4, 5, 6, 7, 4, 5], 8) == [6]


def test_incremental_index_matches_brute_force():
    rng = np.random.default_rng(0)
    index = NgramIndex(6)
    tokens = rng.integers(0, 6, size=30).tolist()
    for step in range(60):  # the index grows by 1 to 4 tokens between lookups
        assert index.lookup(tokens, 5) == _brute_draft(tokens, 5), step
        tokens += rng.integers(0, 6, size=int(rng.integers(1, 5))).tolist()


def test_draft_length_follows_acceptance_per_match_length():
    prop = NgramProposer(50, spec_max=8)
    tokens = list(range(10, 40)) + list(range(10, 13))  # a 3-gram match, 27 tokens to copy
    lengths = []
    for _ in range(4):  # every draft accepted: 2 tokens at first (no evidence), then spec_max
        d = prop.propose("r", tokens, 8)
        lengths.append(len(d))
        prop.record("r", len(d), len(d))
        tokens = tokens + d
    assert lengths[0] == 2 and lengths[-1] == 8 and lengths == sorted(lengths)
    for _ in range(8):  # the first draft token rejected each time: down to one token
        d = prop.propose("r", tokens, 8)
        prop.record("r", len(d), 0)
    assert len(prop.propose("r", tokens, 8)) == 1
    lengths = []
    for _ in range(40):  # a draft token rarely accepted is not worth verifying: mostly none,
        d = prop.propose("r", tokens, 8)  # but one is tried again every few steps
        prop.record("r", len(d), 0)
        lengths.append(len(d))
    assert set(lengths[-20:]) == {0, 1} and 2 <= lengths[-20:].count(1) <= 5
    assert len(prop.propose("r", tokens + [45, 46, 12], 8)) == 2  # a 1-gram match: its own estimate
    prop.release("r")
    assert len(prop.propose("r", tokens, 8)) == 2


def test_proposer_refuses_bad_settings():
    with pytest.raises(ValueError, match="vocabulary size"):
        NgramProposer(2**21)
    with pytest.raises(ValueError, match="spec_max"):
        NgramProposer(100, spec_max=0)


def test_draft_room_leaves_the_bonus_token_within_max_tokens_and_context():
    req = Request("r", [1, 2, 3], max_tokens=5)
    req.token_ids += [4, 5]  # 2 generated, 3 left: 2 drafts + the bonus
    req.num_computed_tokens = 4
    assert draft_room(req, 8, 100) == 2
    assert draft_room(req, 1, 100) == 1
    assert draft_room(req, 8, 7) == 1  # 5 tokens now, at most 7: one draft and the bonus
    req.num_computed_tokens = 3  # two tokens to compute: not decoding, nothing drafted
    assert draft_room(req, 8, 100) == 0


# -- the engine with a stand-in model whose drafts are always right ----------------------------
# StubModel's next token is a fixed function of the last one, so a prompt that holds the chain it
# is about to generate (any stretch of it longer than its cycle, 18 tokens from 9) makes every
# draft accepted and spec_max long: stops and max_tokens fall inside drafts.


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    _, tok = load_tiny(tmp_path_factory.mktemp("stub"), "llama")
    return StubModel(tok.vocab_size, context_length=512), tok


def _chain(model: StubModel, start: int, n: int) -> list[int]:
    out = [start]
    while len(out) < n:
        out.append(model.next_token(out[-1]))
    return out


def _deltas(engine, prompt, params) -> list[tuple]:
    return [(d.token_id, d.text, d.finish_reason, d.num_output_tokens)
            for d in engine.generate(prompt, params)]


def test_stops_inside_accepted_drafts_end_where_plain_decoding_does(stub):
    model, tok = stub
    prompt = _chain(model, 9, 40)  # it cycles: every later token is drafted
    plain = start_engine(stub, max_batch_tokens=64)
    spec = start_engine(stub, max_batch_tokens=64, spec="ngram", spec_max=8)
    try:
        ref = plain.generate(prompt, greedy(30))
        out = [d.token_id for d in ref]
        text = "".join(d.text for d in ref)
        stop_text = tok.decode(out[13:15])  # ends the reply near output token 13
        cases = [greedy(n) for n in (1, 2, 5, 9, 10, 17, 30)]  # max_tokens before, at, after a draft
        cases += [SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=(out[11],)),
                  SamplingParams(temperature=0.0, max_tokens=30, stop=(stop_text,))]
        for params in cases:
            assert _deltas(spec, prompt, params) == _deltas(plain, prompt, params), params
        assert stop_text in text
        st = spec.stats()
        assert st.spec_draft_tokens >= 30 and st.spec_accepted_tokens == st.spec_draft_tokens
        assert_all_blocks_free(spec)
    finally:
        plain.stop()
        spec.stop()


def test_opt_out_and_constrained_requests_draft_nothing(stub):
    model, _ = stub
    prompt = _chain(model, 10, 30)
    spec = start_engine(stub, spec="ngram")
    try:
        off = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, speculative=False)
        a = token_ids(spec.generate(prompt, off))
        assert spec.stats().spec_draft_tokens == 0
        b = token_ids(spec.generate(prompt, greedy(12)))
        assert a == b and spec.stats().spec_draft_tokens > 0
    finally:
        spec.stop()
    with pytest.raises(ValueError, match="speculative"):
        SamplingParams(speculative="no")


# -- the engine on tiny random models: real KV, drafts accepted and rejected --------------------


@pytest.fixture(scope="module", params=["gemma3", "llama"])  # gemma3: a sliding-window KV pool too
def tiny(request, tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("m"), request.param)


def _repetitive_prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    """Random prompts whose second half repeats part of the first (something to draft from)."""
    return [p + p[: max(1, len(p) // 2)] for p in random_prompts(vocab, n, seed)]


def test_greedy_mixed_batch_identical_with_and_without_spec(tiny):
    prompts = _repetitive_prompts(tiny[0].vocab_size, 10, seed=2)
    # some speculate, some opt out, some end inside a draft (few tokens, or a stop token)
    params = [greedy(24), greedy(3), SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                                    speculative=False), greedy(7), greedy(24)] * 2
    plain = start_engine(tiny)
    spec = start_engine(tiny, spec="ngram", spec_max=5)
    try:
        ref = [token_ids(plain.generate(p, q)) for p, q in zip(prompts, params)]
        params[4] = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=(ref[4][9],))
        ref[4] = token_ids(plain.generate(prompts[4], params[4]))
        streams = [spec.add_request(p, q) for p, q in zip(prompts, params)]
        assert [token_ids(list(s)) for s in streams] == ref
        st = spec.stats()
        assert 0 < st.spec_accepted_tokens < st.spec_draft_tokens  # both outcomes exercised
        assert_all_blocks_free(spec)
    finally:
        plain.stop()
        spec.stop()


def test_preemption_and_prefix_cache_with_spec(tiny):
    prompts = _repetitive_prompts(tiny[0].vocab_size, 6, seed=4)
    big = start_engine(tiny)
    small = start_engine(tiny, num_blocks=24, max_batch_tokens=16, spec="ngram", spec_max=4)
    try:
        assert_preempted_equal(big, small, prompts, lambda e, p: e.add_request(p, greedy(12)))
        # the cached blocks of a speculated reply hold its verified tokens' KV: a prompt that is
        # that reply's first 24 tokens continues as the reply did, from cached blocks
        spec = start_engine(tiny, spec="ngram", spec_max=4)
        try:
            first = token_ids(spec.generate(prompts[0], greedy(40)))
            hits = spec.kv.prefix_hits
            again = token_ids(spec.generate(prompts[0] + first[:24], greedy(16)))
            assert spec.kv.prefix_hits - hits >= len(prompts[0]) + 20
            assert again == first[24:40]
            assert spec.stats().spec_draft_tokens > 0
            assert_all_blocks_free(spec)
        finally:
            spec.stop()
    finally:
        big.stop()
        small.stop()


# -- sampling: the same distribution, the same seeded tokens --------------------------------------

A, B = 7, 9  # the two tokens a sampled request may choose (logit bias + top-k 2)
PROMPT = [A, B, A, A, B, B, A, B]  # each of them occurs: every step after the first drafts
SAMPLED = dict(temperature=1.5, top_k=2, logit_bias={A: 50.0, B: 50.0}, frequency_penalty=0.4,
               max_tokens=4, ignore_eos=True)


def _exact_probabilities(engine) -> dict[tuple, float]:
    """P(reply) for every reply in {A, B}^4: each step's p over {A, B} from the raw logprobs the
    engine scores (prompt logprobs), through bias, the frequency penalty over the last 64 history
    tokens, top-k 2 and temperature, as edged.sampling applies them."""
    lp = {}  # (prefix, token) -> raw logprob of token after PROMPT + prefix
    for reply in np.ndindex(2, 2, 2, 2):
        seq = [A if c == 0 else B for c in reply]
        d = engine.generate(PROMPT + seq, SamplingParams(max_tokens=0, prompt_logprobs=0))
        for i, entry in enumerate(d[-1].prompt_logprobs[len(PROMPT):]):
            lp[(tuple(seq[:i]), seq[i])] = entry.logprob
    probs = {}
    for reply in np.ndindex(2, 2, 2, 2):
        seq, p = [A if c == 0 else B for c in reply], 1.0
        for i in range(4):
            hist = (PROMPT + seq[:i])[-64:]
            z = {t: (lp[(tuple(seq[:i]), t)] + 50.0 - 0.4 * hist.count(t)) / 1.5 for t in (A, B)}
            m = max(z.values())
            p *= math.exp(z[seq[i]] - m) / sum(math.exp(v - m) for v in z.values())
        probs[tuple(seq)] = p
    return probs


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square 0.999 quantile (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _samples(engine, seeds) -> list[tuple]:
    streams = [engine.add_request(PROMPT, SamplingParams(seed=s, **SAMPLED)) for s in seeds]
    return [tuple(token_ids(list(s))) for s in streams]


@pytest.mark.parametrize("arch", ["llama"])
def test_sampled_replies_distributed_as_without_spec(arch, tmp_path):
    tiny = load_tiny(tmp_path, arch)
    plain = start_engine(tiny)
    spec = start_engine(tiny, spec="ngram", spec_max=4)
    try:
        probs = _exact_probabilities(plain)
        assert abs(sum(probs.values()) - 1.0) < 1e-9
        seeds = range(2000)
        got = _samples(spec, seeds)
        st = spec.stats()
        assert 0 < st.spec_accepted_tokens < st.spec_draft_tokens
        counts: dict[tuple, int] = {}
        for r in got:
            counts[r] = counts.get(r, 0) + 1
        assert set(counts) <= set(probs)
        n = len(got)
        cells = sorted(probs, key=probs.get)  # cells expecting < 5 are pooled with the next
        chi2, df, pooled_e, pooled_o = 0.0, -1, 0.0, 0
        for c in cells:
            pooled_e += n * probs[c]
            pooled_o += counts.get(c, 0)
            if pooled_e >= 5:
                chi2 += (pooled_o - pooled_e) ** 2 / pooled_e
                df, pooled_e, pooled_o = df + 1, 0.0, 0
        assert df >= 8 and chi2 < _chi2_critical(df), (chi2, df)
        # one draw per output token: each seeded request repeats its plain-decoding reply
        assert got == _samples(plain, seeds)
        assert_all_blocks_free(spec)
    finally:
        plain.stop()
        spec.stop()


@pytest.mark.e2e
def test_edged_run_spec_flag(tmp_path):
    import json

    from click.testing import CliRunner

    from edged.cli import main
    from tests.helpers.tiny_models import write_tiny_model

    path = str(write_tiny_model(tmp_path / "m.gguf", "llama"))
    args = ["run", path, "--prompt-ids", "5,6,7,8,9,5,6,7", "--temperature", "0", "-n", "12", "--json"]
    runs = [CliRunner().invoke(main, args + extra) for extra in ([], ["--spec", "ngram", "--spec-max", "3"])]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    ids = [json.loads(r.stdout.strip().splitlines()[-1])["ids"] for r in runs]
    assert ids[0] == ids[1] and len(ids[0]) == 12
    bad = CliRunner().invoke(main, args + ["--spec", "draft"])
    assert bad.exit_code == 2 and "--spec" in bad.output
