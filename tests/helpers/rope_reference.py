"""RoPE angles in float64, written from the YaRN paper's formulation (Peng et al. 2023, "YaRN:
Efficient Context Window Extension", and transformers' `_compute_yarn_parameters` with truncation,
as llama.cpp always truncates), not from edged's or llama.cpp's code: the independent side of the
rope tests, the numpy test backend and the float64 reference models.

    inv_freq, mscale = rope_frequencies(dim=64, base=150000.0, yarn=Yarn(factor=32, orig_ctx=4096))
    angles = positions[:, None] * inv_freq[None, :]        # cos/sin of these, times mscale
"""

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Yarn:
    factor: float  # context extension factor s (positions interpolated by 1/s in the slow dims)
    orig_ctx: int  # the pre-extension training context L
    beta_fast: float = 32.0  # dims rotating more than beta_fast times over L keep their frequency
    beta_slow: float = 1.0  # dims rotating fewer than beta_slow times over L are fully interpolated
    attn_factor: float = 1.0  # an extra multiplier on the paper's sqrt(1/t) = 0.1 ln(s) + 1
    ext_factor: float = 1.0  # how much of the extrapolation ramp applies (1: the paper's)


def rope_frequencies(dim: int, base: float, freq_scale: float = 1.0, factors=None,
                     yarn: Yarn | None = None) -> tuple[np.ndarray, float]:
    """(inv_freq float64 [dim/2], mscale): pair i turns by position * inv_freq[i], and its cos/sin
    are scaled by mscale. factors: per-pair divisors (Llama 3 rope_freqs); freq_scale: linear
    position scaling (ignored under yarn, whose interpolation is 1/factor)."""
    i = np.arange(dim // 2, dtype=np.float64)
    inv = base ** (-2.0 * i / dim)
    if factors is not None:
        inv = inv / np.asarray(factors, np.float64)
    if yarn is None:
        return inv * freq_scale, 1.0
    # the dim d whose wavelength fits n_rot times in orig_ctx: orig_ctx / (2 pi base^(2d/dim)) = n_rot
    def dim_of(n_rot):
        return dim * math.log(yarn.orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_of(yarn.beta_fast)), 0)
    high = min(math.ceil(dim_of(yarn.beta_slow)), dim - 1)
    if high == low:
        high += 0.001
    extrapolated = (1.0 - np.clip((i - low) / (high - low), 0.0, 1.0)) * yarn.ext_factor  # [dim/2]
    inv = inv / yarn.factor * (1.0 - extrapolated) + inv * extrapolated
    mscale = yarn.attn_factor
    if yarn.ext_factor != 0 and yarn.factor > 1:
        mscale *= 0.1 * math.log(yarn.factor) + 1.0
    return inv, mscale


def rope_params_yarn(p) -> Yarn | None:
    """The Yarn of an edged RopeParams (None when it has none): the tests' bridge to this module."""
    if not p.ext_factor:
        return None
    return Yarn(factor=1.0 / p.freq_scale, orig_ctx=p.orig_ctx, beta_fast=p.beta_fast,
                beta_slow=p.beta_slow, attn_factor=p.attn_factor, ext_factor=p.ext_factor)
