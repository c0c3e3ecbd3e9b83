"""RMS norm and rotary position embedding (RoPE), float32, with llama.cpp's CPU numerics.

rms_norm sums squares in float64 and scales in float32 as ggml_compute_forward_rms_norm_f32 does;
rope builds each token's cos/sin table by repeated float32 multiplication (backends/rope.py holds
the math both backends share, YaRN included), as ggml_rope_cache_init does.
"""

import math

import numba as nb
import numpy as np

from edged.backends import rope as _rope
from edged.backends.base import RopeParams
from edged.backends.cpu.kernel_threads import runs_serial

_pair_features = nb.njit(inline="always")(_rope.pair_features)
_pair_angle = nb.njit(inline="always")(_rope.pair_angle)
_rotate = nb.njit(inline="always")(_rope.rotate)


_NORM_FM = {"reassoc", "contract", "nsz"}


@nb.njit(nogil=True, inline="always", fastmath=_NORM_FM)
def _rms_norm(x, weight, eps, out):
    """x float32 [n, d] -> out [n, d] = x / sqrt(mean(x^2) + eps) * weight."""
    n, d = x.shape
    for r in nb.prange(n):
        s = 0.0  # float64 accumulator, as ggml_float
        for i in range(d):
            v = x[r, i]
            s += np.float64(v * v)
        mean = np.float32(s / d)
        scale = np.float32(1.0) / np.float32(math.sqrt(mean + eps))
        for i in range(d):
            out[r, i] = (x[r, i] * scale) * weight[i]


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_NORM_FM)
def _rms_norm_rows(x, weight, eps, out):
    _rms_norm(x, weight, eps, out)


@nb.njit(nogil=True, cache=True, fastmath=_NORM_FM)
def _rms_norm_rows_serial(x, weight, eps, out):
    _rms_norm(x, weight, eps, out)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """RMS-normalize each row: x float32 [n, d], weight [d] -> [n, d].

    y = x / sqrt(mean(x^2) + eps) * weight. Pass `out=x` to normalize in place. For per-head q/k
    norms reshape x to [n * heads, head_dim] first.
    """
    if x.ndim != 2:
        raise ValueError(f"rms_norm expects x of shape [n, d], got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    if weight.shape != (x.shape[1],):
        raise ValueError(f"rms_norm weight shape {weight.shape} does not match row width {x.shape[1]}")
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("rms_norm out must be a C-contiguous float32 array shaped like x")
    (_rms_norm_rows_serial if runs_serial(x) else _rms_norm_rows)(x, weight, np.float32(eps), out)
    return out


@nb.njit(nogil=True, inline="always")
def _rotate_rows(x, positions, n_dims, neox, theta_scale, freq_scale, table, mscale, out):
    """x float32 [n, heads, hd] -> out: rotate the first n_dims features of every head.

    table float32 [3, n_dims/2] (backends/rope.py rope_table: divisors, interpolated and
    extrapolated weights); cos/sin times mscale. Pairs: neox (i, i + n_dims/2), normal (2i, 2i + 1).
    Features past n_dims are copied unchanged.
    """
    n, heads, hd = x.shape
    half = n_dims // 2
    for t in nb.prange(n):
        cos_t = np.empty(half, dtype=np.float32)  # [n_dims/2]
        sin_t = np.empty(half, dtype=np.float32)  # [n_dims/2]
        theta = np.float32(positions[t])
        for i in range(half):
            a = _pair_angle(theta, freq_scale, table[0, i], table[1, i], table[2, i])
            cos_t[i] = np.float32(math.cos(a)) * mscale
            sin_t[i] = np.float32(math.sin(a)) * mscale
            theta = theta * theta_scale
        for h in range(heads):
            for i in range(half):
                i0, i1 = _pair_features(i, half, neox)
                out[t, h, i0], out[t, h, i1] = _rotate(x[t, h, i0], x[t, h, i1], cos_t[i], sin_t[i])
            for i in range(n_dims, hd):
                out[t, h, i] = x[t, h, i]


@nb.njit(parallel=True, nogil=True, cache=True)
def _rope_rows(x, positions, n_dims, neox, theta_scale, freq_scale, table, mscale, out):
    _rotate_rows(x, positions, n_dims, neox, theta_scale, freq_scale, table, mscale, out)


@nb.njit(nogil=True, cache=True)
def _rope_rows_serial(x, positions, n_dims, neox, theta_scale, freq_scale, table, mscale, out):
    _rotate_rows(x, positions, n_dims, neox, theta_scale, freq_scale, table, mscale, out)


def rope(
    x: np.ndarray, positions: np.ndarray, p: RopeParams, out: np.ndarray | None = None
) -> np.ndarray:
    """Rotary embedding: x float32 [n, heads, hd], positions int32 [n] -> [n, heads, hd].

    Feature pair i of the first p.dim features turns by theta_i = pos * freq_scale *
    base^(-2i/dim) / freq_factors[i] (YaRN-mixed with the unscaled angle when p.ext_factor is set,
    backends/rope.py); pairs are (i, i + dim/2) when p.neox, else (2i, 2i + 1).
    Pass `out=x` to rotate in place.
    """
    if x.ndim != 3:
        raise ValueError(f"rope expects x of shape [n, heads, head_dim], got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, _, hd = x.shape
    positions = np.ascontiguousarray(positions, dtype=np.int32)
    if positions.shape != (n,):
        raise ValueError(f"rope positions shape {positions.shape} does not match {n} tokens")
    args = rope_kernel_args(p, hd)
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("rope out must be a C-contiguous float32 array shaped like x")
    (_rope_rows_serial if runs_serial(x) else _rope_rows)(x, positions, *args, out)
    return out


def rope_kernel_args(p: RopeParams, hd: int) -> tuple:
    """The rope kernels' arguments between positions and out: (n_dims, neox, theta_scale,
    freq_scale, table float32 [3, n_dims/2], mscale)."""
    dim = _rope.rope_dim(p, hd)
    return (dim, bool(p.neox), _rope.rope_theta_scale(dim, p.freq_base), np.float32(p.freq_scale),
            _rope.cached_rope_table(p, dim), _rope.rope_mscale(p))
