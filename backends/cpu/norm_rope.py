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
from edged.backends.cpu.kernel_threads import SERIAL_ELEMENTS, runs_serial

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
def _cos_sin_row(pos, half, theta_scale, freq_scale, table, mscale, cs, t):
    """cs[t] = (cos, sin) [2, n_dims/2] of position pos, times mscale: the angles by repeated
    float32 multiplication (table: backends/rope.py rope_table's divisors and YaRN weights)."""
    theta = np.float32(pos)
    for i in range(half):
        a = _pair_angle(theta, freq_scale, table[0, i], table[1, i], table[2, i])
        cs[t, 0, i] = np.float32(math.cos(a)) * mscale
        cs[t, 1, i] = np.float32(math.sin(a)) * mscale
        theta = theta * theta_scale


@nb.njit(nogil=True, inline="always")
def _rotate_row(x, t, n_dims, neox, cs, ct, out):
    """out[t] = x[t] [heads, hd] with its first n_dims features of every head turned by cs[ct];
    pairs: neox (i, i + n_dims/2), normal (2i, 2i + 1); features past n_dims copied unchanged."""
    heads, hd = x.shape[1], x.shape[2]
    half = n_dims // 2
    for h in range(heads):
        for i in range(half):
            i0, i1 = _pair_features(i, half, neox)
            out[t, h, i0], out[t, h, i1] = _rotate(x[t, h, i0], x[t, h, i1], cs[ct, 0, i], cs[ct, 1, i])
        for i in range(n_dims, hd):
            out[t, h, i] = x[t, h, i]


@nb.njit(nogil=True, inline="always")
def _rotate_rows(x, positions, n_dims, neox, theta_scale, freq_scale, table, mscale, out):
    """x float32 [n, heads, hd] -> out: rotate the first n_dims features of every head, each
    token's cos/sin computed where it is rotated (cs_rows then _rotate_row give the same bits)."""
    n = x.shape[0]
    half = n_dims // 2
    for t in nb.prange(n):
        cs = np.empty((1, 2, half), dtype=np.float32)  # [1, 2, n_dims/2]
        _cos_sin_row(positions[t], half, theta_scale, freq_scale, table, mscale, cs, 0)
        _rotate_row(x, t, n_dims, neox, cs, 0, out)


@nb.njit(nogil=True, inline="always")
def _cs_rows(positions, n_dims, theta_scale, freq_scale, table, mscale):
    n = positions.shape[0]
    cs = np.empty((n, 2, n_dims // 2), dtype=np.float32)  # [n, 2, n_dims/2]
    for t in nb.prange(n):
        _cos_sin_row(positions[t], n_dims // 2, theta_scale, freq_scale, table, mscale, cs, t)
    return cs


@nb.njit(nogil=True, cache=True)
def _cs_rows_serial(positions, n_dims, theta_scale, freq_scale, table, mscale):
    return _cs_rows(positions, n_dims, theta_scale, freq_scale, table, mscale)


@nb.njit(parallel=True, nogil=True, cache=True)
def _cs_rows_parallel(positions, n_dims, theta_scale, freq_scale, table, mscale):
    return _cs_rows(positions, n_dims, theta_scale, freq_scale, table, mscale)


def cs_rows(positions, n_dims, theta_scale, freq_scale, table, mscale):
    """float32 [n, 2, n_dims/2]: every position's (cos, sin), for rotate_rows_with; a prefill's
    positions on the thread pool (the trig is most of a prefill's RoPE)."""
    serial = positions.shape[0] * (n_dims // 2) <= SERIAL_ELEMENTS
    return (_cs_rows_serial if serial else _cs_rows_parallel)(positions, n_dims, theta_scale, freq_scale, table,
                                                               mscale)


@nb.njit(nogil=True, inline="always")
def _rotate_rows_with(x, cs, n_dims, neox, out):
    for t in nb.prange(x.shape[0]):
        _rotate_row(x, t, n_dims, neox, cs, t, out)


@nb.njit(nogil=True, cache=True)
def rotate_rows_with(x, cs, n_dims, neox, out):
    """_rope_rows_serial with each token's (cos, sin) from cs [n, 2, n_dims/2] (cs_rows): the
    same bits, the table computed once for q and k and every layer of a step (rope_store)."""
    _rotate_rows_with(x, cs, n_dims, neox, out)


@nb.njit(parallel=True, nogil=True, cache=True)
def rotate_rows_with_parallel(x, cs, n_dims, neox, out):
    """rotate_rows_with on the thread pool (a prefill's q and k)."""
    _rotate_rows_with(x, cs, n_dims, neox, out)


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
