"""YaRN RoPE (RopeParams.ext_factor) on the CPU backend against the float64 formulation of the
paper (tests/helpers/rope_reference.py).

Bound: max |y - ref| <= 2e-5 * max|x| * mscale for positions < 200, as plain rope
(tests/backends/test_norm_rope.py; measured 1.5e-5 * max|x| there too): the angles come from
repeated float32 products, which drift a few ulps per frequency step.
The CUDA backend runs the same tables (tests/backends/cuda/test_cuda_ops.py::test_rope_yarn).
"""

import math

import numpy as np
import pytest

from edged.backends.base import RopeParams
from edged.backends.cpu import rope
from edged.backends.rope import rope_mscale, rope_table, yarn_corr_dims
from tests.helpers.rope_reference import Yarn, rope_frequencies

POSITIONS = np.array([0, 1, 5, 17, 100, 199], dtype=np.int32)


def reference(x, positions, dim, base, neox, yarn, factors=None):
    """x [n, heads, hd] rotated in float64: the first dim features, pairs (i, i + dim/2) or (2i, 2i+1)."""
    inv, mscale = rope_frequencies(dim, base, factors=factors, yarn=yarn)
    z = positions.astype(np.float64)[:, None, None] * inv[None, None, :]  # [n, 1, dim/2]
    c, s = mscale * np.cos(z), mscale * np.sin(z)
    x = x.astype(np.float64)
    out = x.copy()
    if neox:
        a, b = x[..., : dim // 2], x[..., dim // 2 : dim]
        out[..., : dim // 2], out[..., dim // 2 : dim] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:dim:2], x[..., 1:dim:2]
        out[..., 0:dim:2], out[..., 1:dim:2] = a * c - b * s, a * s + b * c
    return out


def yarn_params(dim, base, neox, yarn: Yarn, factors=None) -> RopeParams:
    return RopeParams(dim=dim, freq_base=base, neox=neox, freq_scale=1.0 / yarn.factor, freq_factors=factors,
                      ext_factor=yarn.ext_factor, attn_factor=yarn.attn_factor, orig_ctx=yarn.orig_ctx,
                      beta_fast=yarn.beta_fast, beta_slow=yarn.beta_slow)


# (head_dim, rope dim, base, yarn): gpt-oss (64 dims, base 150000, factor 32 over 4096), Qwen3's
# documented YaRN (factor 4 over 32768), a partial rotation with custom betas and attn_factor,
# and half the ramp (ext_factor 0.5)
CASES = [
    (64, 64, 150000.0, Yarn(32.0, 4096)),
    (128, 128, 1000000.0, Yarn(4.0, 32768)),
    (80, 48, 10000.0, Yarn(8.0, 2048, beta_fast=16.0, beta_slow=2.0, attn_factor=0.9)),
    (32, 32, 10000.0, Yarn(16.0, 512, ext_factor=0.5)),
]


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("hd,dim,base,yarn", CASES)
def test_yarn_matches_paper_formulation(neox, hd, dim, base, yarn):
    rng = np.random.default_rng(hd + dim)
    x = rng.standard_normal((len(POSITIONS), 3, hd)).astype(np.float32)
    p = yarn_params(dim, base, neox, yarn)
    y = rope(x, POSITIONS, p)
    _, mscale = rope_frequencies(dim, base, yarn=yarn)
    assert abs(float(rope_mscale(p)) - mscale) <= 1e-6 * mscale
    bound = 2e-5 * np.abs(x).max() * mscale
    assert np.abs(y - reference(x, POSITIONS, dim, base, neox, yarn)).max() <= bound
    np.testing.assert_array_equal(y[:, :, dim:], x[:, :, dim:])  # unrotated tail copied
    np.testing.assert_allclose(y[0, :, :dim], x[0, :, :dim] * mscale, rtol=1e-6)  # position 0: scale only


def test_yarn_with_rope_freqs_divisors():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((len(POSITIONS), 2, 32)).astype(np.float32)
    factors = rng.uniform(1.0, 4.0, 16).astype(np.float32)
    yarn = Yarn(8.0, 1024)
    y = rope(x, POSITIONS, yarn_params(32, 10000.0, True, yarn, factors))
    ref = reference(x, POSITIONS, 32, 10000.0, True, yarn, factors)
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(x).max() * rope_frequencies(32, 10000.0, yarn=yarn)[1]


def test_ramp_sits_between_the_correction_dims():
    """Pairs below the low correction dim keep the unscaled angle, pairs from the high one on take
    the linearly interpolated one, both times mscale; the ones between are mixed."""
    dim, base, s, orig = 64, 150000.0, 32.0, 4096
    low = max(math.floor(dim * math.log(orig / (32 * 2 * math.pi)) / (2 * math.log(base))), 0)
    high = min(math.ceil(dim * math.log(orig / (1 * 2 * math.pi)) / (2 * math.log(base))), dim - 1)
    assert yarn_corr_dims(dim, orig, base, 32.0, 1.0) == (low, high) == (8, 18)  # gpt-oss's
    rng = np.random.default_rng(1)
    x = rng.standard_normal((len(POSITIONS), 2, dim)).astype(np.float32)
    p = RopeParams(dim=dim, freq_base=base, neox=True, freq_scale=1 / s, ext_factor=1.0, orig_ctx=orig)
    m = float(rope_mscale(p))
    assert m == pytest.approx(1 + 0.1 * math.log(s), rel=1e-6)
    yarn = rope(x, POSITIONS, p)
    plain = rope(x, POSITIONS, RopeParams(dim=dim, freq_base=base, neox=True))
    linear = rope(x, POSITIONS, RopeParams(dim=dim, freq_base=base, neox=True, freq_scale=1 / s))
    half = dim // 2
    fast = np.r_[0:low, half : half + low]  # features of pairs < low (neox layout)
    slow = np.r_[high:half, half + high : dim]
    mixed = np.r_[low + 1 : high, half + low + 1 : half + high]
    np.testing.assert_allclose(yarn[..., fast], m * plain[..., fast], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(yarn[..., slow], m * linear[..., slow], rtol=1e-5, atol=1e-6)
    late = POSITIONS >= 17  # where the two angles have drifted apart
    assert np.abs(yarn[late][..., mixed] - m * plain[late][..., mixed]).max() > 1e-2
    assert np.abs(yarn[late][..., mixed] - m * linear[late][..., mixed]).max() > 1e-2


def test_ext_factor_zero_is_plain_rope_bit_for_bit():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((len(POSITIONS), 2, 32)).astype(np.float32)
    off = RopeParams(dim=32, freq_base=10000.0, neox=False, freq_scale=0.5, orig_ctx=4096, ext_factor=0.0)
    np.testing.assert_array_equal(rope(x, POSITIONS, off),
                                  rope(x, POSITIONS, RopeParams(dim=32, freq_base=10000.0, neox=False,
                                                                freq_scale=0.5)))
    table = rope_table(off, 32)
    assert (table[1] == 1).all() and (table[2] == 0).all()


def test_table_is_rebuilt_when_a_field_changes():
    x = np.ones((2, 1, 16), np.float32)
    pos = np.array([0, 50], np.int32)
    p = RopeParams(dim=16, freq_base=10000.0, neox=True, freq_scale=0.25, ext_factor=1.0, orig_ctx=64)
    first = rope(x, pos, p)
    p.orig_ctx = 1024
    second = rope(x, pos, p)
    assert np.abs(first - second).max() > 1e-3
    np.testing.assert_array_equal(second, rope(x, pos, RopeParams(dim=16, freq_base=10000.0, neox=True,
                                                                   freq_scale=0.25, ext_factor=1.0,
                                                                   orig_ctx=1024)))


def test_yarn_without_original_context_is_an_error():
    with pytest.raises(ValueError, match="orig_ctx"):
        rope(np.zeros((1, 1, 16), np.float32), np.zeros(1, np.int32),
             RopeParams(dim=16, freq_base=10000.0, neox=True, freq_scale=0.25, ext_factor=1.0))
