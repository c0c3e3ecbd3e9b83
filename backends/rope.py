"""RoPE math both backends share: parameter checks, the frequency tables and the per-pair formulas.

The rotation follows llama.cpp (ggml_rope_cache_init + rope_yarn): feature pair i of the first
`dim` features turns by freq_scale * theta_i / factor_i, where theta_0 is the position and
theta_{i+1} = theta_i * theta_scale in float32 (repeated products, so long positions round as in
llama.cpp), theta_scale = base^(-2/dim), factor_i = 1 or Llama 3's rope_freqs divisors.
With YaRN (RopeParams.ext_factor != 0) pair i's angle is instead
interp_i * (1 - mix_i) + extrap_i * mix_i, extrap_i = theta_i / factor_i, interp_i = freq_scale *
extrap_i, mix_i = ext_factor * ramp_i (1 for the fast pairs below the low correction dim, 0 above
the high one, linear between), and cos/sin are multiplied by attn_factor * (1 + 0.1 ln(1/freq_scale)).

The pair formulas below are plain Python: each backend compiles them into its own kernel
(numba.njit on the CPU, numba.cuda device functions on the CUDA backend).
"""

import numpy as np

from edged.backends.base import RopeParams


def rope_theta_scale(dim: int, freq_base: float) -> np.float32:
    """base^(-2/dim) rounded as llama.cpp computes it: powf(base, -2.0f / n_dims) in float32."""
    e = np.float32(-2.0) / np.float32(dim)
    return np.float32(float(np.float32(freq_base)) ** float(e))


def rope_dim(p: RopeParams, head_dim: int) -> int:
    """p.dim as an int; ValueError unless it is even, positive and within head_dim."""
    dim = int(p.dim)
    if dim <= 0 or dim % 2 or dim > head_dim:
        raise ValueError(f"rope dim {dim} must be even and within head_dim {head_dim}")
    return dim


def rope_factors(p: RopeParams, dim: int) -> np.ndarray:
    """Per-frequency divisors float32 [dim/2]: p.freq_factors (Llama 3 rope_freqs) or ones."""
    if p.freq_factors is None:
        return np.ones(dim // 2, dtype=np.float32)
    factors = np.ascontiguousarray(p.freq_factors, dtype=np.float32)
    if factors.shape != (dim // 2,):
        raise ValueError(f"rope freq_factors shape {factors.shape} != ({dim // 2},)")
    return factors


def pair_features(i, half, neox):
    """Feature indices (i0, i1) of rotation pair i: (i, i + half) for NeoX, else (2i, 2i + 1)."""
    if neox:
        return i, i + half
    return 2 * i, 2 * i + 1


def yarn_corr_dims(dim: int, orig_ctx: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[np.float32, np.float32]:
    """(low, high): the pairs between which YaRN's ramp falls from extrapolation to interpolation.

    Pair index d completes n_rot turns over orig_ctx positions where
    d = dim * ln(orig_ctx / (2 pi n_rot)) / (2 ln base); low (beta_fast turns) is floored and
    clamped at 0, high (beta_slow turns) ceiled and clamped at dim - 1, in float32 as llama.cpp."""
    f = np.float32

    def corr_dim(n_rot):
        ratio = f(orig_ctx) / (f(n_rot) * f(2) * f(np.pi))
        return f(dim) * f(np.log(ratio)) / (f(2) * f(np.log(f(freq_base))))

    low = f(np.floor(corr_dim(beta_fast)))
    high = f(np.ceil(corr_dim(beta_slow)))
    return max(f(0), low), min(f(dim - 1), high)


def rope_table(p: RopeParams, dim: int) -> np.ndarray:
    """float32 [3, dim/2] per pair: the divisor factor_i, the weight of the interpolated angle
    (1 - mix_i) and of the extrapolated one (mix_i); mix is all 0 without YaRN."""
    half = dim // 2
    table = np.zeros((3, half), dtype=np.float32)
    table[0] = rope_factors(p, dim)
    mix = np.zeros(half, dtype=np.float32)
    if p.ext_factor != 0:
        if int(p.orig_ctx) <= 0:
            raise ValueError(f"YaRN rope needs orig_ctx > 0, got {p.orig_ctx}")
        low, high = yarn_corr_dims(dim, int(p.orig_ctx), p.freq_base, p.beta_fast, p.beta_slow)
        y = (np.arange(half, dtype=np.float32) - low) / max(np.float32(0.001), high - low)  # [half]
        ramp = np.float32(1) - np.minimum(np.float32(1), np.maximum(np.float32(0), y))
        mix = ramp * np.float32(p.ext_factor)
    table[1] = np.float32(1) - mix
    table[2] = mix
    return table


def cached_rope_table(p: RopeParams, dim: int) -> np.ndarray:
    """rope_table(p, dim), kept on p (every layer's q and k read it each step) and rebuilt if a
    field it depends on changed."""
    key = (dim, p.freq_base, id(p.freq_factors), p.ext_factor, p.orig_ctx, p.beta_fast, p.beta_slow)
    hit = p.__dict__.get("_table")
    if hit is not None and hit[0] == key and hit[1] is p.freq_factors:
        return hit[2]
    table = rope_table(p, dim)
    p.__dict__["_table"] = (key, p.freq_factors, table)
    return table


def rope_mscale(p: RopeParams) -> np.float32:
    """The cos/sin multiplier: attn_factor, times 1 + 0.1 ln(1/freq_scale) under YaRN."""
    m = np.float32(p.attn_factor)
    if p.ext_factor != 0:
        m = m * (np.float32(1) + np.float32(0.1) * np.float32(np.log(np.float32(1) / np.float32(p.freq_scale))))
    return np.float32(m)


def pair_angle(theta, freq_scale, factor, w_interp, w_extrap):
    """Angle of a pair whose repeated-product frequency is theta (float32 throughout): the
    interpolated angle freq_scale * theta / factor, mixed with the unscaled one under YaRN
    (w_interp 1, w_extrap 0 without it, which leaves the interpolated angle exact)."""
    extrap = theta / factor
    return (freq_scale * extrap) * w_interp + extrap * w_extrap


def rotate(x0, x1, cs, sn):
    """(x0, x1) turned by the angle whose cosine and sine are cs, sn."""
    return x0 * cs - x1 * sn, x0 * sn + x1 * cs
