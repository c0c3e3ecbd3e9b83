"""Sampling: filtered distributions (chi-square), seeds, penalties, logit_bias, logprobs, greedy."""

import numpy as np
import pytest

from edged.sampling import Sampler, SamplingParams, make_rng, sample
from edged.sampling import _adjusted_row, _draw, _top_k_ids, _top_p_full

# Upper 0.001 quantiles of the chi-square distribution by degrees of freedom (standard tables):
# a correct sampler fails one of these tests with probability 0.1 %; seeds are fixed, so a run is
# deterministic anyway.
CHI2_CRIT_P001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322,
                  8: 26.124, 9: 27.877, 10: 29.588, 11: 31.264}

# 12 logits with clear gaps, so no filter boundary sits on a rounding edge.
LOGITS = np.array([2.0, 1.7, 1.4, 0.9, 0.5, 0.2, -0.3, -0.8, -1.2, -2.0, -3.0, -4.5], np.float32)
N_DRAWS = 20_000


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def reference_probs(logits, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0):
    """The filtered softmax, written plainly: full sort, llama.cpp's chain order."""
    lg = logits.astype(np.float64)
    order = np.argsort(-lg, kind="stable")
    cand = order[:top_k] if top_k > 0 else order
    if top_p < 1.0:
        cum = np.cumsum(softmax(lg[cand]))
        cand = cand[: int(np.argmax(cum >= top_p)) + 1]
    if min_p > 0.0:
        p = softmax(lg[cand])
        cand = cand[p >= min_p * p.max()]
    out = np.zeros_like(lg)
    out[cand] = softmax(lg[cand] / temperature)
    return out


def draw_counts(logits, params, n=N_DRAWS, seed=1234, batch=2000):
    rng = np.random.default_rng(seed)
    counts = np.zeros(logits.shape[0], np.int64)
    rows = np.broadcast_to(logits, (batch, logits.shape[0]))
    for _ in range(n // batch):
        toks, _ = sample(rows, [params] * batch, None, [rng] * batch)
        counts += np.bincount(toks, minlength=logits.shape[0])
    return counts


def assert_matches(counts, expected):
    """Chi-square goodness of fit; live bins expected to get < 5 draws are pooled into one bin,
    as the test requires."""
    n = counts.sum()
    live = expected > 0
    assert counts[~live].sum() == 0, f"filtered-out tokens were drawn: {np.flatnonzero(counts * ~live)}"
    obs, exp = counts[live].astype(np.float64), expected[live] * n
    order = np.argsort(exp)
    obs, exp = obs[order], exp[order]
    cut = 0  # pool the smallest bins until the pooled bin expects at least 5 draws
    while cut < len(exp) and (exp[:cut].sum() < 5 if cut else exp[0] < 5):
        cut += 1
    if cut:
        obs = np.concatenate([[obs[:cut].sum()], obs[cut:]])
        exp = np.concatenate([[exp[:cut].sum()], exp[cut:]])
    df = len(exp) - 1
    if df == 0:
        return
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < CHI2_CRIT_P001[df], f"chi2 = {chi2:.2f} >= {CHI2_CRIT_P001[df]} (df = {df})"


FILTER_CASES = {
    "plain": dict(),
    "temperature_0.5": dict(temperature=0.5),
    "temperature_2": dict(temperature=2.0),
    "top_k_4": dict(top_k=4),
    "top_p_0.8": dict(top_p=0.8),
    "min_p_0.1": dict(min_p=0.1),
    "combined": dict(top_k=8, top_p=0.9, min_p=0.05, temperature=1.5),
    "combined_cold": dict(top_k=6, top_p=0.95, min_p=0.02, temperature=0.7),
}


@pytest.mark.parametrize("case", sorted(FILTER_CASES))
def test_filtered_distribution_chi_square(case):
    kw = FILTER_CASES[case]
    expected = reference_probs(LOGITS, **kw)
    if case != "plain" and not case.startswith("temperature"):
        assert (expected == 0).any()  # the case really filters something
    assert_matches(draw_counts(LOGITS, SamplingParams(**kw)), expected)


def test_large_row_paths_distribution():
    # A 65,536-token row with 12 live tokens scattered among very unlikely ones exercises the
    # block-sum draw, the thresholded top-k and the incremental top-p of full rows.
    v = 65_536
    rng = np.random.default_rng(7)
    row = np.full(v, -30.0, np.float32)
    pos = rng.choice(v, size=12, replace=False)
    row[pos] = LOGITS
    for kw in (dict(), dict(top_k=5), dict(top_p=0.7), dict(min_p=0.2, temperature=0.8)):
        counts = draw_counts(row, SamplingParams(**kw), n=1500, batch=500)
        ref = reference_probs(LOGITS, **kw)
        if not kw:  # the 65,524 filler tokens hold ~1e-9 of the mass: ignore them
            assert counts.sum() - counts[pos].sum() <= 2
            counts, ref = counts[pos], ref
        else:
            full = np.zeros(v)
            full[pos] = ref
            assert counts[full == 0].sum() == 0
            counts, ref = counts[pos], ref
        assert_matches(counts, ref / ref.sum())


def test_top_k_ids_and_top_p_full_are_exact():
    rng = np.random.default_rng(3)
    row = rng.standard_normal(100_000).astype(np.float32) * 4
    for k in (1, 40, 1000):
        assert set(_top_k_ids(row, k)) == set(np.argsort(-row, kind="stable")[:k])
    row[::7] = 99.0  # ties and adversarial spacing still give the exact set size
    assert len(set(_top_k_ids(row, 500))) == 500
    assert row[_top_k_ids(row, 500)].min() == 99.0
    masked = np.full(100_000, -np.inf, np.float32)  # a few live tokens among masked ones
    masked[[5, 50, 500]] = [1.0, 2.0, 3.0]
    got = _top_k_ids(masked, 40)
    assert len(set(got)) == 40 and {5, 50, 500} <= set(got)
    row = rng.standard_normal(100_000).astype(np.float32) * 4
    for p in (0.3, 0.9, 0.999):  # grows past the first 256-token block for the larger p
        ids, _ = _top_p_full(row, p)
        assert set(ids) == set(np.flatnonzero(reference_probs(row, top_p=p)))


def test_draw_never_picks_zero_weight():
    w = np.zeros(10_000, np.float32)
    w[[17, 4096, 9999]] = [1.0, 2.0, 1.0]
    picks = {_draw(w, u) for u in np.linspace(0.0, 0.999999, 2001)}
    assert picks == {17, 4096, 9999}


def test_same_seed_same_tokens_whatever_the_batch():
    rng = np.random.default_rng(0)
    vocab, steps = 50, 30
    logits = rng.standard_normal((steps, 6, vocab)).astype(np.float32) * 2
    target = SamplingParams(seed=42, top_k=20, temperature=0.9)

    def run(position, others):
        g = make_rng(target)
        other_rngs = [make_rng(p) if p.temperature > 0 else None for p in others]
        out = []
        for s in range(steps):
            params = list(others)
            params.insert(position, target)
            rngs = list(other_rngs)
            rngs.insert(position, g)
            rows = logits[s, : len(params)].copy()
            rows[position] = logits[s, 5]  # the target request always sees the same logits
            toks, _ = sample(rows, params, None, rngs)
            out.append(int(toks[position]))
        return out

    alone = run(0, [])
    assert run(2, [SamplingParams(), SamplingParams(temperature=0), SamplingParams(seed=7)]) == alone
    assert run(1, [SamplingParams(top_p=0.5, seed=1), SamplingParams(min_p=0.3)]) == alone
    other_seed = SamplingParams(seed=43, top_k=20, temperature=0.9)
    g2 = make_rng(other_seed)
    diff = [int(sample(logits[s, 5:6], [other_seed], None, [g2])[0][0]) for s in range(steps)]
    assert diff != alone


def test_sampler_keeps_one_generator_per_request():
    logits = np.random.default_rng(1).standard_normal((20, 2, 30)).astype(np.float32)
    p = [SamplingParams(seed=5), SamplingParams(seed=6)]

    def run():
        s = Sampler()
        out = [s.sample(logits[i], ["a", "b"], p)[0].tolist() for i in range(20)]
        s.release("a")
        return out

    assert run() == run()


def test_greedy_is_argmax():
    logits = np.random.default_rng(2).standard_normal((7, 1000)).astype(np.float32)
    params = [SamplingParams(temperature=0)] * 7
    toks, infos = sample(logits, params)  # greedy rows need no generator
    assert toks.dtype == np.int32
    np.testing.assert_array_equal(toks, logits.argmax(axis=1))
    assert infos == [None] * 7
    # Mixed batch: greedy rows stay argmax whatever the sampled rows do.
    mixed = [SamplingParams(temperature=0), SamplingParams(seed=1), SamplingParams(temperature=0, top_k=3)]
    toks, _ = sample(logits[:3], mixed, None, [None, make_rng(mixed[1]), None])
    assert toks[0] == logits[0].argmax() and toks[2] == logits[2].argmax()


def test_repetition_presence_frequency_penalties_exact():
    row = np.array([2.0, -1.0, 1.0, 0.5, 3.0], np.float32)
    p = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    out = _adjusted_row(row, p, [0, 1, 1, 3, 0, 0], 5)
    # token 0: 2/2 - 0.5 - 3*0.25; token 1: -1*2 - 0.5 - 2*0.25; token 3: 0.5/2 - 0.5 - 0.25
    np.testing.assert_allclose(out, [-0.25, -3.0, 1.0, -0.5, 3.0], rtol=0, atol=1e-6)
    assert row[0] == 2.0  # the caller's logits are not modified
    # Only the last repeat_last_n history tokens count.
    win = SamplingParams(repetition_penalty=2.0, repeat_last_n=2)
    np.testing.assert_allclose(_adjusted_row(row, win, [4, 0, 2], 5), [1.0, -1.0, 0.5, 0.5, 3.0])
    off = SamplingParams(repetition_penalty=2.0, repeat_last_n=0)
    assert _adjusted_row(row, off, [0], 5) is row


def test_penalties_and_bias_change_distribution_as_specified():
    hist = [0, 0, 2]
    p = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2,
                       logit_bias={5: 1.5, 1: -100})
    lg = LOGITS.astype(np.float64).copy()
    lg[5] += 1.5
    lg[1] -= 100
    for tok, count in ((0, 2), (2, 1)):
        lg[tok] = lg[tok] / 1.3 if lg[tok] > 0 else lg[tok] * 1.3
        lg[tok] -= 0.4 * count + 0.2
    rng = np.random.default_rng(9)
    counts = np.zeros(12, np.int64)
    for _ in range(10):
        toks, _ = sample(np.broadcast_to(LOGITS, (2000, 12)), [p] * 2000, [hist] * 2000, [rng] * 2000)
        counts += np.bincount(toks, minlength=12)
    expected = softmax(lg)
    assert counts[1] == 0  # a -100 bias makes the token practically impossible
    expected[1] = 0.0
    assert_matches(counts, expected / expected.sum())
    # Greedy honours bias and penalties too.
    g = SamplingParams(temperature=0, logit_bias={"7": 10.0})  # JSON-style string keys accepted
    assert sample(LOGITS[None], [g])[0][0] == 7
    g = SamplingParams(temperature=0, repetition_penalty=5.0)
    assert sample(LOGITS[None], [g], [[0]])[0][0] == 1


def test_logprobs_are_raw_log_softmax():
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((3, 5000)) * 3).astype(np.float32)
    params = [SamplingParams(seed=1, top_k=3, logprobs=5, logit_bias={10: 50.0}, repetition_penalty=2.0),
              SamplingParams(temperature=0, logprobs=0),
              SamplingParams(seed=2)]
    toks, infos = sample(logits, params, [[1, 2, 3]] * 3, [make_rng(p) for p in params])
    ref = logits.astype(np.float64)
    ref = ref - ref.max(axis=1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
    assert toks[0] == 10  # the bias wins the draw, but logprobs ignore it
    a = infos[0]
    np.testing.assert_allclose(a.token_logprob, ref[0, 10], atol=1e-5)
    top = np.argsort(-ref[0])[:5]
    np.testing.assert_array_equal(a.top_ids, top)
    np.testing.assert_allclose(a.top_logprobs, ref[0, top], atol=1e-5)
    assert a.top_ids.dtype == np.int32 and a.top_logprobs.dtype == np.float32
    b = infos[1]
    np.testing.assert_allclose(b.token_logprob, ref[1].max(), atol=1e-5)
    assert b.top_ids.size == 0
    assert infos[2] is None


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature must be finite"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=1.5), "top_k must be an integer"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(logit_bias={1: 101}), r"logit_bias\[1\]"),
    (dict(logit_bias={-1: 1}), "token id must be >= 0"),
    (dict(logit_bias={"x": 1}), "logit_bias token id must be an integer"),
    (dict(seed=-1), "seed"),
    (dict(logprobs=21), "logprobs"),
    (dict(max_tokens=-1), "max_tokens"),
    (dict(prompt_logprobs=21), "prompt_logprobs"),
    (dict(stop=[""]), "stop"),
    (dict(stop=["a"] * 17), "stop"),
    (dict(repeat_last_n=-2), "repeat_last_n"),
])
def test_params_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_bad_inputs_at_sample_time():
    p = SamplingParams(seed=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sample(LOGITS[None], [SamplingParams(logit_bias={12: 1.0}, seed=0)], None, [make_rng(p)])
    with pytest.raises(ValueError, match="NaN"):
        sample(np.full((1, 12), np.nan, np.float32), [p], None, [make_rng(p)])
    with pytest.raises(ValueError, match="NaN"):
        sample(np.full((1, 12), np.nan, np.float32), [SamplingParams(temperature=0)])
    with pytest.raises(ValueError, match="random generator"):
        sample(LOGITS[None], [p])
    with pytest.raises(ValueError, match=r"\[n, V\]"):
        sample(LOGITS, [p])
    with pytest.raises(ValueError, match="history token ids"):
        sample(LOGITS[None], [SamplingParams(repetition_penalty=1.1, seed=0)], [[99]], [make_rng(p)])
    assert SamplingParams(stop="###").stop == ("###",)


def test_plain_greedy_rows_among_other_rows():
    # greedy rows without bias/penalties take the batched argmax path (all rows, or a subset)
    logits = np.random.default_rng(5).standard_normal((5, 3000)).astype(np.float32)
    ps = [SamplingParams(temperature=0), SamplingParams(seed=3), SamplingParams(temperature=0),
          SamplingParams(temperature=0, logit_bias={7: 100.0}), SamplingParams(temperature=0)]
    rngs = [None, make_rng(ps[1]), None, None, None]
    toks, _ = sample(logits, ps, None, rngs)
    for i in (0, 2, 4):
        assert toks[i] == logits[i].argmax()
    assert toks[3] == 7
    bad = logits.copy()
    bad[2] = np.nan  # a NaN row among plain greedy rows of a mixed batch is still refused
    with pytest.raises(ValueError, match="NaN"):
        sample(bad, ps, None, [None, make_rng(ps[1]), None, None, None])
    with pytest.raises(ValueError, match="NaN"):
        sample(bad[[0, 2]], [ps[0], ps[2]])


@pytest.mark.parametrize("t", [1e-40, 5e-324])
def test_a_temperature_whose_inverse_overflows_is_greedy(t):
    # found beside schemathesis's tiny repetition penalty: 1 / t overflowed float32, 0 * inf drew -1
    logits = np.random.default_rng(6).standard_normal((1, 3000)).astype(np.float32)
    p = SamplingParams(temperature=t, seed=1)
    toks, _ = sample(logits, [p], None, [make_rng(p)])
    assert toks[0] == logits[0].argmax()


def test_a_tiny_repetition_penalty_keeps_logits_finite():
    # found by schemathesis: a positive logit / 5e-324 was +inf, so the request failed as NaN
    p = SamplingParams(repetition_penalty=5e-324, seed=2)
    row = _adjusted_row(LOGITS.copy(), p, [int(LOGITS.argmax()), 3], LOGITS.shape[0])
    assert np.isfinite(row).all()
    toks, _ = sample(LOGITS[None], [p], [[int(LOGITS.argmax()), 3]], [make_rng(p)])
    assert 0 <= toks[0] < LOGITS.shape[0]
