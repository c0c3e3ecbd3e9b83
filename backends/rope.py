"""RoPE math both backends share: parameter checks, the frequency tables and the per-pair formulas.

The rotation follows llama.cpp (ggml_rope_cache_init + rope_yarn without YaRN): feature pair i of
the first `dim` features turns by freq_scale * theta_i / factor_i, where theta_0 is the position and
theta_{i+1} = theta_i * theta_scale in float32 (repeated products, so long positions round as in
llama.cpp), theta_scale = base^(-2/dim), factor_i = 1 or Llama 3's rope_freqs divisors.

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


def pair_angle(theta, freq_scale, factor):
    """Angle of a pair whose repeated-product frequency is theta (float32 throughout)."""
    return freq_scale * (theta / factor)


def rotate(x0, x1, cs, sn):
    """(x0, x1) turned by the angle whose cosine and sine are cs, sn."""
    return x0 * cs - x1 * sn, x0 * sn + x1 * cs
