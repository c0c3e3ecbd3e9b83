"""Gated FFN activations and elementwise ops, float32.

gelu_tanh_mul computes ggml's tanh-approximated GELU formula exactly by default; with
ggml_fp16=True it reproduces llama.cpp's CPU path instead, which rounds the input to float16 and
reads GELU from a float16 table (ggml's GGML_GELU_FP16), so logits can match llama.cpp more closely.
"""

import math

import numba as nb
import numpy as np

from edged.backends.cpu.fastexp import exp_nonpos
from edged.backends.cpu.kernel_threads import runs_serial

_FM = {"contract", "nsz", "arcp"}  # no reassoc: elementwise, nothing to reorder

_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
_GELU_COEF_A = np.float32(0.044715)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)


@nb.njit(inline="always", fastmath=_FM)
def _x_sigmoid(x, z):
    """x * sigmoid(z), with e^(-|z|) from the vectorizable exp: libm's exp and tanh are scalar
    calls per element (docs/kernels.md has the figures)."""
    e = exp_nonpos(-abs(z))
    num = _ONE if z >= np.float32(0.0) else e
    return x * num / (_ONE + e)


@nb.njit(inline="always", fastmath=_FM)
def _gelu(x):
    # 0.5 x (1 + tanh(y)) = x * sigmoid(2y)
    y = _SQRT_2_OVER_PI * x * (_ONE + _GELU_COEF_A * x * x)
    return _x_sigmoid(x, np.float32(2.0) * y)


# The gated kernels read gate and up as columns g0.. of xg and u0.. of xu (C-contiguous [n, *]):
# the two halves of one fused gate|up matmul output are read in place (_operands).


@nb.njit(inline="always")
def _at(c0, i):
    """Column c0 + i as an unsigned index: a signed one gets Numba's negative-index wraparound,
    which stops LLVM vectorizing the loop (3x slower)."""
    return np.uintp(c0) + np.uintp(i)


@nb.njit(nogil=True, inline="always", fastmath=_FM)
def _gelu_tanh_mul(xg, g0, xu, u0, out):
    n, f = out.shape
    for r in nb.prange(n):
        for i in range(f):
            out[r, i] = _gelu(xg[r, _at(g0, i)]) * xu[r, _at(u0, i)]


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FM)
def _gelu_tanh_mul_rows(xg, g0, xu, u0, out):
    _gelu_tanh_mul(xg, g0, xu, u0, out)


@nb.njit(nogil=True, cache=True, fastmath=_FM, error_model="numpy")
def _gelu_tanh_mul_rows_serial(xg, g0, xu, u0, out):
    _gelu_tanh_mul(xg, g0, xu, u0, out)


@nb.njit(inline="always")
def _f32_to_f16_bits(b):
    """IEEE float32 bits (uint32 as int64) -> float16 bits, round to nearest even (as F16C)."""
    sign = (b >> 16) & 0x8000
    exp = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    if exp == 0xFF:  # inf / nan
        return sign | 0x7C00 | (0x200 if mant else 0)
    e = exp - 127 + 15
    if e >= 31:
        return sign | 0x7C00
    if e <= 0:  # float16 subnormal or zero
        if e < -10:
            return sign
        mant = mant | 0x800000
        shift = 14 - e
        h = mant >> shift
        rem = mant & ((1 << shift) - 1)
        halfway = 1 << (shift - 1)
        if rem > halfway or (rem == halfway and (h & 1)):
            h += 1
        return sign | h
    h = (e << 10) | (mant >> 13)
    rem = mant & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (h & 1)):
        h += 1  # a carry into the exponent is the correct rounding
    return sign | h


@nb.njit(nogil=True, inline="always")
def _gelu_fp16_mul(xg, g0, xu, u0, table, out):
    n, f = out.shape
    bits = xg.view(np.uint32)  # [n, *]
    for r in nb.prange(n):
        for i in range(f):
            x = xg[r, _at(g0, i)]
            if x <= np.float32(-10.0):
                g = np.float32(0.0)
            elif x >= np.float32(10.0):
                g = x
            else:
                g = table[_f32_to_f16_bits(np.int64(bits[r, _at(g0, i)]))]
            out[r, i] = g * xu[r, _at(u0, i)]


@nb.njit(parallel=True, nogil=True, cache=True)
def _gelu_fp16_mul_rows(xg, g0, xu, u0, table, out):
    _gelu_fp16_mul(xg, g0, xu, u0, table, out)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _gelu_fp16_mul_rows_serial(xg, g0, xu, u0, table, out):
    _gelu_fp16_mul(xg, g0, xu, u0, table, out)


def _build_gelu_f16_table() -> np.ndarray:
    """float32 [65536]: GELU of every float16 value, rounded to float16 (ggml_table_gelu_f16)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)  # [65536]
    with np.errstate(invalid="ignore", over="ignore"):
        y = _HALF * x * (_ONE + np.tanh(_SQRT_2_OVER_PI * x * (_ONE + _GELU_COEF_A * x * x)))
    return y.astype(np.float32).astype(np.float16).astype(np.float32)


_GELU_F16_TABLE: np.ndarray | None = None


@nb.njit(nogil=True, inline="always", fastmath=_FM)
def _silu_mul(xg, g0, xu, u0, out):
    n, f = out.shape
    for r in nb.prange(n):
        for i in range(f):
            x = xg[r, _at(g0, i)]
            out[r, i] = _x_sigmoid(x, x) * xu[r, _at(u0, i)]


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FM)
def _silu_mul_rows(xg, g0, xu, u0, out):
    _silu_mul(xg, g0, xu, u0, out)


@nb.njit(nogil=True, cache=True, fastmath=_FM, error_model="numpy")
def _silu_mul_rows_serial(xg, g0, xu, u0, out):
    _silu_mul(xg, g0, xu, u0, out)


@nb.njit(nogil=True, inline="always", fastmath=_FM)
def _swiglu_oai(xg, g0, xu, u0, alpha, limit, out):
    n, f = out.shape
    for r in nb.prange(n):
        for i in range(f):
            x = min(xg[r, _at(g0, i)], limit)  # the gate is clamped from above only
            y = min(max(xu[r, _at(u0, i)], -limit), limit)
            out[r, i] = _x_sigmoid(x, alpha * x) * (y + _ONE)


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=_FM)
def _swiglu_oai_rows(xg, g0, xu, u0, alpha, limit, out):
    _swiglu_oai(xg, g0, xu, u0, alpha, limit, out)


@nb.njit(nogil=True, cache=True, fastmath=_FM, error_model="numpy")
def _swiglu_oai_rows_serial(xg, g0, xu, u0, alpha, limit, out):
    _swiglu_oai(xg, g0, xu, u0, alpha, limit, out)


@nb.njit(nogil=True, inline="always")
def _softcap(x, cap, out):
    n, f = x.shape
    inv = _ONE / cap
    for r in nb.prange(n):
        for i in range(f):
            out[r, i] = cap * np.float32(math.tanh(x[r, i] * inv))


@nb.njit(parallel=True, nogil=True, cache=True)
def _softcap_rows(x, cap, out):
    _softcap(x, cap, out)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _softcap_rows_serial(x, cap, out):
    _softcap(x, cap, out)


def _columns_of(a):
    """(C-contiguous float32 [n, c] array, first column) holding a float32 [n, f]: a itself, the
    array a is a column slice of (slice_cols' views: no copy), or else a contiguous copy."""
    if a.dtype == np.float32:
        if a.flags.c_contiguous:
            return a, 0
        b = a.base  # a slice b[:, c0:c1] has b's strides and starts c0 floats into its first row
        if (isinstance(b, np.ndarray) and b.dtype == np.float32 and b.flags.c_contiguous
                and a.shape[0] == b.shape[0] and a.strides == b.strides):
            off = (a.ctypes.data - b.ctypes.data) // 4
            if 0 <= off and off + a.shape[1] <= b.shape[1]:
                return b, off
    return np.ascontiguousarray(a, dtype=np.float32), 0


def _operands(gate, up, out, name):
    """(xg, g0, xu, u0, out): the gated kernels' operands for gate and up float32 [n, f]."""
    if gate.ndim != 2 or gate.shape != up.shape:
        raise ValueError(f"{name}: gate {gate.shape} and up {up.shape} must be equal [n, f] shapes")
    if out is None:
        out = np.empty(gate.shape, np.float32)
    elif out.shape != gate.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name}: out must be a C-contiguous float32 array shaped like gate")
    return (*_columns_of(gate), *_columns_of(up), out)


def gelu_tanh_mul(
    gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None, ggml_fp16: bool = False
) -> np.ndarray:
    """GEGLU: gelu_tanh(gate) * up, gate/up float32 [n, f] -> [n, f].

    gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). ggml_fp16=True reproduces
    llama.cpp's CPU rounding (float16 input, float16 table, identity past |x| >= 10).
    """
    *xs, out = _operands(gate, up, out, "gelu_tanh_mul")
    if ggml_fp16:
        global _GELU_F16_TABLE
        if _GELU_F16_TABLE is None:
            _GELU_F16_TABLE = _build_gelu_f16_table()
        (_gelu_fp16_mul_rows_serial if runs_serial(out) else _gelu_fp16_mul_rows)(*xs, _GELU_F16_TABLE, out)
    else:
        (_gelu_tanh_mul_rows_serial if runs_serial(out) else _gelu_tanh_mul_rows)(*xs, out)
    return out


def silu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SwiGLU: silu(gate) * up with silu(x) = x / (1 + exp(-x)); float32 [n, f] -> [n, f]."""
    *xs, out = _operands(gate, up, out, "silu_mul")
    (_silu_mul_rows_serial if runs_serial(out) else _silu_mul_rows)(*xs, out)
    return out


SWIGLU_OAI_ALPHA = 1.702  # gpt-oss's (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants)
SWIGLU_OAI_LIMIT = 7.0


def swiglu_oai_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None,
                   alpha: float = SWIGLU_OAI_ALPHA, limit: float = SWIGLU_OAI_LIMIT) -> np.ndarray:
    """gpt-oss's clamped SwiGLU (ggml_swiglu_oai): x = min(gate, limit), y = clamp(up, -limit, limit),
    x * sigmoid(alpha x) * (y + 1); gate/up float32 [n, f] -> [n, f]."""
    *xs, out = _operands(gate, up, out, "swiglu_oai_mul")
    (_swiglu_oai_rows_serial if runs_serial(out) else _swiglu_oai_rows)(*xs, np.float32(alpha), np.float32(limit), out)
    return out


def softcap(x: np.ndarray, cap: float, out: np.ndarray | None = None) -> np.ndarray:
    """cap * tanh(x / cap) elementwise (Gemma 2's logit soft-capping); x float32 [n, f]."""
    if cap <= 0:
        raise ValueError(f"softcap cap must be > 0, got {cap}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"softcap expects x of shape [n, f], got {x.shape}")
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("softcap out must be a C-contiguous float32 array shaped like x")
    (_softcap_rows_serial if runs_serial(x) else _softcap_rows)(x, np.float32(cap), out)
    return out


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Elementwise a + b in float32 (residual connections; b may also be a bias row [d] added to
    every row of a [n, d]); out=a adds in place."""
    if a.shape != b.shape and not (b.ndim == 1 and a.ndim == 2 and a.shape[1] == b.shape[0]):
        raise ValueError(f"add: shapes {a.shape} and {b.shape} differ")
    return np.add(a, b, out=out, dtype=np.float32)


def scale(x: np.ndarray, s: float, out: np.ndarray | None = None) -> np.ndarray:
    """x * s in float32 (e.g. Gemma's sqrt(d_model) embedding scale); out=x scales in place."""
    return np.multiply(x, np.float32(s), out=out, dtype=np.float32)
