"""backends/cpu/moe_route.py against a numpy statement of the same gating (argsort-based, as
models/moe.py routed before), and the grouping's invariants."""

import numpy as np
import pytest

from edged.backends.cpu.moe_route import GATING_CODES, route_groups


def _numpy_route(logits, k, gating, norm, scale, gate_b, probs_b):
    x = logits + (0 if gate_b is None else gate_b)
    if gating == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        probs = e / e.sum(axis=1, keepdims=True)
    elif gating == "sigmoid":
        with np.errstate(over="ignore"):
            probs = (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)
    else:
        probs = x
    score = probs if probs_b is None else probs + probs_b
    chosen = np.argsort(-score, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, chosen, axis=1)
    if gating == "softmax_topk":
        e = np.exp(w - w.max(axis=1, keepdims=True))
        w = e / e.sum(axis=1, keepdims=True)
    if norm:
        w = w / np.maximum(w.sum(axis=1, keepdims=True), np.float32(6.103515625e-5))
    return chosen, (w * np.float32(scale)).astype(np.float32)


@pytest.mark.parametrize("gating", list(GATING_CODES))
@pytest.mark.parametrize("norm, scale, biases", [(False, 1.0, False), (True, 2.5, True)])
def test_matches_numpy_routing(gating, norm, scale, biases):
    rng = np.random.default_rng(7)
    n, E, k = 37, 32, 4
    logits = (rng.standard_normal((n, E)) * 3).astype(np.float32)
    logits[3] = 0.0  # all tied: the lowest ids win
    logits[5, :6] = -200.0  # sigmoid's exp(-x) overflows to inf: probs 0
    gate_b = (rng.standard_normal(E) * 0.5).astype(np.float32) if biases else None
    probs_b = (rng.standard_normal(E) * 0.5).astype(np.float32) if biases else None
    chosen, w, *_ = route_groups(logits, k, gating, norm, scale, gate_b, probs_b)
    want_c, want_w = _numpy_route(logits, k, gating, norm, scale, gate_b, probs_b)
    assert np.array_equal(chosen, want_c)
    np.testing.assert_allclose(w, want_w, rtol=2e-6, atol=1e-30)
    if not biases:
        assert chosen[3].tolist() == [0, 1, 2, 3]


def test_nan_logits_rank_last_and_never_crash():
    logits = np.array([[np.nan, 1.0, np.nan, 2.0]], np.float32)
    chosen, *_ = route_groups(logits, 3, "softmax_topk")
    assert chosen.tolist() == [[3, 1, 0]]


@pytest.mark.parametrize("n", [1, 5, 64])
def test_groups_hold_every_pair_in_order(n):
    rng = np.random.default_rng(n)
    k, E = 3, 8
    chosen, w, tokens, experts, cuts, src = route_groups(rng.standard_normal((n, E)).astype(np.float32), k, "softmax")
    assert cuts[0] == 0 and cuts[-1] == n * k and np.all(np.diff(cuts) > 0)
    assert np.all(np.diff(experts) > 0) and len(experts) == len(cuts) - 1
    group_of = np.repeat(np.arange(len(experts)), np.diff(cuts))  # [P]
    for t in range(n):
        for r in range(k):
            q = src[t, r]
            assert tokens[q] == t and experts[group_of[q]] == chosen[t, r]
    for a, b in zip(cuts[:-1], cuts[1:]):
        assert np.all(np.diff(tokens[a:b]) > 0)  # each token once per group, ascending
    assert sorted(src.ravel().tolist()) == list(range(n * k))
