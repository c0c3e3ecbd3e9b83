"""The packed-bitmask logit kernel equals a numpy reference bit for bit; untouched rows stay exact."""

import numpy as np
import pytest

from edged.backends.cpu.logit_mask import apply_token_bitmask, apply_token_bitmask_reference


def _random(rng, n, vocab, words, kind):
    bm = rng.integers(-(2**31), 2**31, size=(n, words), dtype=np.int64).astype(np.int32)
    if kind == "ones":
        bm[:, ::2] = -1
    elif kind == "sparse":
        bm[:] = 0
        bm[:, rng.integers(0, words, 5)] = rng.integers(1, 2**31, 5, dtype=np.int64).astype(np.int32)
    elif kind == "edges":  # sign bit and bit 0 only
        bm[:] = np.int32(-(2**31)) | np.int32(1)
    logits = rng.standard_normal((n, vocab)).astype(np.float32)
    logits[0, :7] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e38, -1e-38]
    return logits, bm


@pytest.mark.parametrize("kind", ["random", "ones", "sparse", "edges"])
@pytest.mark.parametrize("vocab,words", [(262144, 8192), (300, 10), (333, 11), (70, 2), (31, 1)])
def test_matches_reference(kind, vocab, words):
    rng = np.random.default_rng(vocab + len(kind))
    logits, bm = _random(rng, 5, vocab, words, kind)
    rows = np.array([0, 2, 3])
    a, b = logits.copy(), logits.copy()
    apply_token_bitmask(a, bm, rows)
    apply_token_bitmask_reference(b, bm, rows)
    assert np.array_equal(a.view(np.int32), b.view(np.int32))
    for r in (1, 4):  # unconstrained rows: exactly the same bits
        assert np.array_equal(a[r].view(np.int32), logits[r].view(np.int32))
    allowed = np.unpackbits(bm[2].view(np.uint8), bitorder="little")[:vocab].astype(bool)
    if words * 32 >= vocab:
        assert np.array_equal(np.isneginf(a[2]) & ~np.isneginf(logits[2]), ~allowed & ~np.isneginf(logits[2]))


def test_all_rows_default_and_checks():
    rng = np.random.default_rng(1)
    logits, bm = _random(rng, 3, 100, 4, "random")
    a, b = logits.copy(), logits.copy()
    apply_token_bitmask(a, bm)
    apply_token_bitmask_reference(b, bm, range(3))
    assert np.array_equal(a.view(np.int32), b.view(np.int32))
    with pytest.raises(ValueError):
        apply_token_bitmask(logits.astype(np.float64), bm)
    with pytest.raises(ValueError):
        apply_token_bitmask(logits, bm[:2])
    with pytest.raises(ValueError):
        apply_token_bitmask(logits, bm, [3])
    with pytest.raises(ValueError):
        apply_token_bitmask(logits[:, ::2], bm)
