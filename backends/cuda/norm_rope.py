"""RMS norm and rotary embedding on the device, with the CPU backend's numerics
(backends/cpu/norm_rope.py): squares summed in float64 and scaled in float32; each pair's angle
built by repeated float32 multiplication of the position, as ggml_rope_cache_init does (the RoPE
math both backends share is in backends/rope.py)."""

import math

import numpy as np
from numba import cuda, float32, float64

from edged.backends import rope as _rope
from edged.backends.base import RopeParams
from edged.backends.cuda.launch import launch_1d
from edged.backends.cuda.memory import as_device

NORM_THREADS = 128  # threads per row (a power of two: tree reduction)

_pair_features = cuda.jit(device=True, inline=True)(_rope.pair_features)
_pair_angle = cuda.jit(device=True, inline=True)(_rope.pair_angle)
_rotate = cuda.jit(device=True, inline=True)(_rope.rotate)


@cuda.jit
def _rms_norm_rows(x, weight, eps, out):
    """One block per row: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight."""
    scr = cuda.shared.array(NORM_THREADS, float64)
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    d = x.shape[1]
    s = float64(0.0)
    for i in range(tid, d, nt):
        v = x[r, i]
        s += float64(v * v)
    scr[tid] = s
    cuda.syncthreads()
    stride = nt // 2
    while stride > 0:
        if tid < stride:
            scr[tid] += scr[tid + stride]
        cuda.syncthreads()
        stride //= 2
    mean = float32(scr[0] / d)
    scale = float32(1.0) / float32(math.sqrt(mean + eps))
    for i in range(tid, d, nt):
        out[r, i] = (x[r, i] * scale) * weight[i]


def rms_norm(x, weight, eps: float, out=None):
    """RMS-normalize each row of device x float32 [n, d] with weight [d] -> new [n, d] (or `out`,
    which may be x). For per-head q/k norms reshape x to [n * heads, head_dim] first."""
    x = as_device(x, np.float32, "rms_norm x")
    if x.ndim != 2:
        raise ValueError(f"rms_norm expects x of shape [n, d], got {tuple(x.shape)}")
    weight = as_device(weight, np.float32, "rms_norm weight")
    if tuple(weight.shape) != (x.shape[1],):
        raise ValueError(f"rms_norm weight shape {tuple(weight.shape)} does not match row width {x.shape[1]}")
    if out is None:
        out = cuda.device_array(x.shape, dtype=np.float32)  # [n, d]
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != np.float32:
        raise ValueError("rms_norm out must be a float32 device array shaped like x")
    n, d = x.shape
    if n:
        threads = 32
        while threads < NORM_THREADS and threads < d:
            threads *= 2
        _rms_norm_rows[n, threads](x, weight, np.float32(eps), out)
    return out


@cuda.jit
def _rope_rows(x, positions, n_dims, neox, theta_scale, freq_scale, table, mscale, out):
    """One thread per (token, pair i < n_dims/2) rotating that pair in every head, plus one per
    (token, feature past n_dims) copying it. table float32 [3, n_dims/2]: backends/rope.py's
    rope_table (divisors, interpolated and extrapolated weights); cos/sin times mscale."""
    n, heads, hd = x.shape
    half = n_dims // 2
    per = half + (hd - n_dims)
    i = cuda.grid(1)
    if i >= n * per:
        return
    t = i // per
    j = i % per
    if j < half:
        theta = float32(positions[t])
        for _ in range(j):
            theta = theta * theta_scale
        a = _pair_angle(theta, freq_scale, table[0, j], table[1, j], table[2, j])
        cs = float32(math.cos(a)) * mscale
        sn = float32(math.sin(a)) * mscale
        i0, i1 = _pair_features(j, half, neox)
        for h in range(heads):
            out[t, h, i0], out[t, h, i1] = _rotate(x[t, h, i0], x[t, h, i1], cs, sn)
    else:
        c = n_dims + (j - half)
        for h in range(heads):
            out[t, h, c] = x[t, h, c]


def _table_on_device(p: RopeParams, dim: int):
    """rope_table on the device, uploaded once per host table (kept on p beside it)."""
    host = _rope.cached_rope_table(p, dim)
    hit = p.__dict__.get("_device_table")
    if hit is not None and hit[0] is host:
        return hit[1]
    dev = cuda.to_device(host)
    p.__dict__["_device_table"] = (host, dev)
    return dev


def rope(x, positions, p: RopeParams, out=None):
    """Rotary embedding of device x float32 [n, heads, hd] at positions int32 [n] (host or device)
    -> new [n, heads, hd] (or `out`, which may be x). Same maths as the CPU backend's rope."""
    x = as_device(x, np.float32, "rope x")
    if x.ndim != 3:
        raise ValueError(f"rope expects x of shape [n, heads, head_dim], got {tuple(x.shape)}")
    n, _, hd = x.shape
    positions = as_device(positions, np.int32, "rope positions")
    if tuple(positions.shape) != (n,):
        raise ValueError(f"rope positions shape {tuple(positions.shape)} does not match {n} tokens")
    dim = _rope.rope_dim(p, hd)
    table = _table_on_device(p, dim)  # [3, dim/2]
    if out is None:
        out = cuda.device_array(x.shape, dtype=np.float32)  # [n, heads, hd]
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != np.float32:
        raise ValueError("rope out must be a float32 device array shaped like x")
    per = dim // 2 + (hd - dim)
    if n:
        blocks, threads = launch_1d(n * per, 128)
        theta_scale = _rope.rope_theta_scale(dim, p.freq_base)
        _rope_rows[blocks, threads](x, positions, np.int32(dim), np.int32(1 if p.neox else 0), theta_scale,
                                    np.float32(p.freq_scale), table, _rope.rope_mscale(p), out)
    return out
