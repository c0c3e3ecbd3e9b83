"""The full-row sampling kernels against float64 numpy: softmax denominators and inverse-CDF draws."""

import numpy as np
import pytest

from edged.backends.cpu.sampling import DRAW_BLOCK, SCAN_CHUNK, draw_softmax, rows_scan, softmax_denominator


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


@pytest.mark.parametrize("v", [1, 7, SCAN_CHUNK, SCAN_CHUNK + 3, 262144])
def test_rows_scan_is_numpys_argmax_and_finiteness(v):
    rng = np.random.default_rng(v)
    logits = (rng.standard_normal((5, v)) * 8 - 20).astype(np.float32)  # [5, v], mostly negative
    logits[1] = -np.abs(logits[1])  # every value negative
    if v > 2:
        logits[2, [v // 3, v - 1]] = logits[2].max() + 1  # a tie: the first index wins
    best, finite = rows_scan(logits)
    np.testing.assert_array_equal(best, logits.argmax(axis=1))
    assert finite.all() and rows_scan(logits, argmax=False)[0] is None


def test_rows_scan_flags_inf_and_nan_rows_only():
    logits = np.random.default_rng(0).standard_normal((6, 3 * SCAN_CHUNK)).astype(np.float32)
    logits[1, 5] = np.nan
    logits[2, SCAN_CHUNK + 1] = np.inf
    logits[3, -1] = -np.inf
    logits[4, 2 * SCAN_CHUNK] = -np.nan  # a NaN with the sign bit set
    _, finite = rows_scan(logits)
    assert finite.tolist() == [True, False, False, False, False, True]


def test_rows_scan_signed_zero_ties_as_numpy():
    """The row's max is 0: -0.0 in an earlier chunk equals the +0.0 after it, as numpy's argmax says."""
    logits = np.full((1, 2 * SCAN_CHUNK), -1.0, np.float32)
    logits[0, 10] = -0.0
    logits[0, SCAN_CHUNK + 10] = 0.0
    assert rows_scan(logits)[0][0] == logits.argmax() == 10


def test_sampling_kernels_are_serial():
    """They run on the engine's thread: a parallel one would give that thread an OpenMP team beside
    the compute thread's, and libgomp then throttles both (HTTP decode fell 54.6 -> 39.4 tok/s)."""
    import edged.backends.cpu.sampling as s

    kernels = [v for v in vars(s).values() if hasattr(v, "targetoptions")]
    assert len(kernels) >= 3 and not any(k.targetoptions.get("parallel") for k in kernels)


def test_rows_scan_parallel_gives_the_serial_scan():
    """The compute thread's parallel scan (the server's big steps) returns what the serial one does:
    ties, signed zeros, NaN and inf rows alike."""
    from edged.backends.cpu.rows_scan_parallel import rows_scan_parallel

    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((7, 3 * SCAN_CHUNK + 5)) * 4).astype(np.float32)  # [7, V]
    logits[1, [7, 2 * SCAN_CHUNK]] = logits[1].max() + 1  # a tie across chunks
    logits[2] = -1.0
    logits[2, 10], logits[2, SCAN_CHUNK + 10] = -0.0, 0.0
    logits[3, 5] = np.nan
    logits[4, -1] = -np.inf
    best, finite = rows_scan_parallel(logits)
    ref_best, ref_finite = rows_scan(logits)
    np.testing.assert_array_equal(finite, ref_finite)
    assert finite.tolist() == [True, True, True, False, False, True, True]
    np.testing.assert_array_equal(best[finite], ref_best[finite])
    np.testing.assert_array_equal(best[finite], logits[finite].argmax(axis=1))
