"""Elementwise ops on the device (float32): gated FFN activations, softcap, add, scale, and the
row / column copies a forward pass needs (take_rows, slice_cols).

GELU is the CPU backend's default formula (activations._gelu: tanh approximation in float32),
not llama.cpp's float16 table.
"""

import math

import numpy as np
from numba import cuda, float32

from edged.backends.cuda.launch import launch_1d
from edged.backends.cuda.memory import as_device, is_device
from edged.quant.dequant import checked_indices

_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
_GELU_COEF_A = np.float32(0.044715)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)


def _flat(d):
    """A 1-D view of a C-contiguous device array."""
    return d.reshape(int(np.prod(d.shape, dtype=np.int64)))


@cuda.jit
def _gelu_mul(g, u, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        x = g[i]
        out[i] = _HALF * x * (_ONE + float32(math.tanh(_SQRT_2_OVER_PI * x * (_ONE + _GELU_COEF_A * x * x)))) * u[i]


@cuda.jit
def _silu_mul(g, u, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        x = g[i]
        out[i] = x / (_ONE + float32(math.exp(-x))) * u[i]


@cuda.jit
def _softcap(x, cap, inv, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = cap * float32(math.tanh(x[i] * inv))


@cuda.jit
def _add(a, b, out):
    """out = a + b, b broadcast over a's rows when shorter (b.size divides a.size)."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i] + b[i % b.shape[0]]


@cuda.jit
def _scale(x, s, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * s


@cuda.jit
def _take_rows(x, rows, out):
    """out[i, :] = x[rows[i], :] over 2-D views [n, c] (NaN for an out-of-range row)."""
    nr, c = out.shape
    i = cuda.grid(1)
    if i < nr * c:
        r = rows[i // c]
        out[i // c, i % c] = x[r, i % c] if 0 <= r < x.shape[0] else float32(np.nan)


@cuda.jit
def _slice_cols(x, start, out):
    n, c = out.shape
    i = cuda.grid(1)
    if i < n * c:
        out[i // c, i % c] = x[i // c, start + i % c]


def _out_like(x, out, name):
    if out is None:
        return cuda.device_array(x.shape, dtype=np.float32)
    if tuple(out.shape) != tuple(x.shape) or out.dtype != np.float32 or not is_device(out):
        raise ValueError(f"{name}: out must be a float32 device array of shape {tuple(x.shape)}")
    return out


def _launch(kern, size, *args):
    if size:
        blocks, threads = launch_1d(size)
        kern[blocks, threads](*args)


def _pair(gate, up, out, name):
    gate = as_device(gate, np.float32, f"{name} gate")
    up = as_device(up, np.float32, f"{name} up")
    if gate.ndim != 2 or tuple(gate.shape) != tuple(up.shape):
        raise ValueError(f"{name}: gate {tuple(gate.shape)} and up {tuple(up.shape)} must be equal [n, f] shapes")
    return gate, up, _out_like(gate, out, name)


def gelu_tanh_mul(gate, up, out=None):
    """GEGLU on the device: gelu_tanh(gate) * up, float32 [n, f] -> [n, f]."""
    gate, up, out = _pair(gate, up, out, "gelu_tanh_mul")
    _launch(_gelu_mul, gate.size, _flat(gate), _flat(up), _flat(out))
    return out


def silu_mul(gate, up, out=None):
    """SwiGLU on the device: gate / (1 + exp(-gate)) * up, float32 [n, f] -> [n, f]."""
    gate, up, out = _pair(gate, up, out, "silu_mul")
    _launch(_silu_mul, gate.size, _flat(gate), _flat(up), _flat(out))
    return out


def softcap(x, cap: float, out=None):
    """cap * tanh(x / cap) elementwise (x / cap computed as x · (1/cap), as on the CPU)."""
    if cap <= 0:
        raise ValueError(f"softcap cap must be > 0, got {cap}")
    x = as_device(x, np.float32, "softcap x")
    out = _out_like(x, out, "softcap")
    cap32 = np.float32(cap)
    _launch(_softcap, x.size, _flat(x), cap32, np.float32(1.0) / cap32, _flat(out))
    return out


def add(a, b, out=None):
    """a + b in float32; b has a's shape or is a row vector [d] added to every row of a [.., d].
    out=a adds in place."""
    a = as_device(a, np.float32, "add a")
    b = as_device(b, np.float32, "add b")
    width = tuple(a.shape)[-1] if a.ndim else 0  # (the simulator's shapes reject negative indices)
    if tuple(b.shape) != tuple(a.shape) and not (b.ndim == 1 and b.shape[0] == width):
        raise ValueError(f"add: shapes {tuple(a.shape)} and {tuple(b.shape)} differ (b may be a row of width {width})")
    out = _out_like(a, out, "add")
    if a.size:
        _launch(_add, a.size, _flat(a), _flat(b), _flat(out))
    return out


def scale(x, s: float, out=None):
    """x * s in float32; out=x scales in place."""
    x = as_device(x, np.float32, "scale x")
    out = _out_like(x, out, "scale")
    _launch(_scale, x.size, _flat(x), np.float32(s), _flat(out))
    return out


def take_rows(x, rows):
    """x[rows] for device x float32 [n, ...] and rows int32 [r] (host: range-checked; device: an
    out-of-range row reads as NaN) -> new [r, ...]."""
    x = as_device(x, np.float32, "take_rows x")
    if x.ndim < 1:
        raise ValueError("take_rows: x must have at least one dimension")
    n = int(x.shape[0])
    if not is_device(rows):
        rows = checked_indices(rows, n, "take_rows: row")
    rows = as_device(rows, np.int32, "take_rows rows")
    nr = int(rows.shape[0])
    c = int(np.prod(x.shape[1:], dtype=np.int64)) if x.ndim > 1 else 1
    out = cuda.device_array((nr,) + tuple(x.shape[1:]), dtype=np.float32)
    if nr and c and n:
        _launch(_take_rows, nr * c, x.reshape(n, c), rows, out.reshape(nr, c))
    return out


def slice_cols(x, start: int, stop: int):
    """Columns start:stop of device x float32 [n, c] as a new C-contiguous [n, stop - start]."""
    x = as_device(x, np.float32, "slice_cols x")
    if x.ndim != 2:
        raise ValueError(f"slice_cols expects x of shape [n, c], got {tuple(x.shape)}")
    start, stop = int(start), int(stop)
    if not 0 <= start <= stop <= x.shape[1]:
        raise ValueError(f"slice_cols: [{start}, {stop}) is not within {x.shape[1]} columns")
    n = int(x.shape[0])
    out = cuda.device_array((n, stop - start), dtype=np.float32)
    _launch(_slice_cols, n * (stop - start), x, np.int32(start), out)
    return out
