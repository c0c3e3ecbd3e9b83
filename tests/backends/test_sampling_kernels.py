"""The full-row sampling kernels against float64 numpy: softmax denominators and inverse-CDF draws."""

import numpy as np
import pytest

from edged.backends.cpu.sampling import DRAW_BLOCK, draw_softmax, softmax_denominator


def _row(v, seed, scale=3.0, n_inf=0):
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(v) * scale).astype(np.float32)
    if n_inf:
        row[rng.choice(v, n_inf, replace=False)] = -np.inf
    return row


def _weights64(row, inv_t):
    mx = row[np.isfinite(row)].max()
    return mx, np.exp((row.astype(np.float64) - mx) * inv_t)


@pytest.mark.parametrize("v", [1, 7, DRAW_BLOCK, 3 * DRAW_BLOCK + 5, 262144])
@pytest.mark.parametrize("inv_t", [1.0, 1 / 0.7, 4.0])
def test_denominator_matches_float64(v, inv_t):
    row = _row(v, v, n_inf=v // 10)
    mx, w = _weights64(row, inv_t)
    got = softmax_denominator(row, np.float32(mx), np.float32(inv_t))
    assert got == pytest.approx(w.sum(), rel=2e-6)


def test_draw_is_the_inverse_cdf():
    row = _row(5 * DRAW_BLOCK + 77, 3, n_inf=500)
    inv_t = np.float32(1 / 0.8)
    mx, w = _weights64(row, inv_t)
    cdf = np.cumsum(w)
    us = np.random.default_rng(4).random(2000)
    for u in np.concatenate([us, [0.0, 1 - 1e-12]]):
        j = draw_softmax(row, np.float32(mx), inv_t, float(u))
        assert np.isfinite(row[j])  # -inf tokens are never drawn
        target = u * cdf[-1]
        expect = min(int(np.searchsorted(cdf, target, side="right")), len(row) - 1)
        # float32 weights and sums may move a draw only across a boundary closer than this
        if np.min(np.abs(cdf - target)) > 1e-5 * cdf[-1]:
            assert j == expect


def test_draw_far_below_the_max_has_weight_zero():
    row = np.full(3000, -200.0, np.float32)  # 200 nats below the max: weight exactly 0
    row[1234] = 0.0
    for u in (0.0, 0.5, 1 - 1e-12):
        assert draw_softmax(row, np.float32(0.0), np.float32(1.0), u) == 1234
    assert softmax_denominator(row, np.float32(0.0), np.float32(1.0)) == 1.0


def test_draw_distribution_chi_square():
    row = np.array([2.0, 1.0, 0.0, -1.0, -np.inf, 0.5] * 400, np.float32)  # 2400 tokens, 3 blocks
    inv_t = np.float32(1.5)
    mx, w = _weights64(row, inv_t)
    p = w / w.sum()
    rng = np.random.default_rng(9)
    n = 40000
    counts = np.bincount([draw_softmax(row, np.float32(mx), inv_t, rng.random()) % 6 for _ in range(n)],
                         minlength=6)
    expect = n * p.reshape(-1, 6).sum(axis=0)  # per position within the repeating pattern
    live = expect > 0
    assert counts[~live].sum() == 0
    chi2 = (((counts - expect) ** 2)[live] / expect[live]).sum()
    assert chi2 < 20.5  # 4 degrees of freedom, p ~ 0.0004
