"""The llama.cpp rounding emulation's building blocks (no model needed): activation quantizers
against gguf-py and their definitions, and the float16 flash attention against exact attention."""

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from tests.models.llamacpp_emulation import Emulator, f16, quant_q8_0, quant_q8_K


def _x(n, k, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[:, 5] *= 40  # an outlier per row, as Gemma's residual stream has
    return x


def test_q8_0_matches_gguf_quantizer():
    """Per-32 int8 with a float16 scale: equal to gguf-py's Q8_0 round trip except where x*127/amax
    and x/(amax/127) round apart (a half-way tie), and then by one step only."""
    x = _x(8, 256)
    ours = quant_q8_0(x)
    ref = dequantize(quantize(x, QT.Q8_0), QT.Q8_0).astype(np.float64)
    step = f16(np.abs(x.reshape(8, 8, 32)).max(-1) / np.float32(127)).repeat(32, -1).reshape(8, 256)
    assert np.mean(ours == ref) > 0.999
    assert np.all(np.abs(ours - ref) <= step * 1.0001)


def test_q8_K_definition():
    """Per-256: the largest-magnitude value maps to -127 exactly (scale 1/(-127/max)); every value is
    an integer multiple of the scale in [-127, 127] within half a step of x."""
    x = _x(3, 512, seed=1)
    y = quant_q8_K(x).reshape(3, 2, 256)
    xb = x.reshape(3, 2, 256).astype(np.float64)
    mx = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)
    d = (np.float32(1) / (np.float32(-127) / mx.astype(np.float32))).astype(np.float64)
    q = y / d
    assert np.allclose(q, np.rint(q)) and np.abs(q).max() <= 127
    assert np.allclose(np.take_along_axis(q, np.abs(xb).argmax(-1)[..., None], -1), -127)
    assert np.all(np.abs(y - xb) <= np.abs(d) * 0.5 + 1e-6)


def test_f16_rounds_to_nearest_even():
    assert f16(np.float32(1 + 2**-11)) == 1.0  # a tie rounds to the even mantissa
    assert f16(np.float32(1 + 3 * 2**-11)) == np.float32(1 + 2**-9)
    assert f16(np.float32(70000)) == np.inf


def test_flash_attention_emulation_close_to_exact():
    """ggml's one-chunk flash attention (f16 Q and V sums) stays within float16 error of exact
    causal softmax attention, and masks the same keys (sliding window 3)."""
    rng = np.random.default_rng(2)
    T, H, d = 7, 2, 16
    q = rng.standard_normal((T, H, d)).astype(np.float32) * 0.5
    k = f16(rng.standard_normal((T, H, d)))
    v = f16(rng.standard_normal((T, H, d)))
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = (j <= i) & (i - j < 3)
    got = Emulator._fa_ggml(q, k, v, mask).reshape(T, H, d)
    s = np.einsum("thd,jhd->htj", q.astype(np.float64), k.astype(np.float64))
    s = np.where(mask[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("htj,jhd->thd", p, v.astype(np.float64))
    np.testing.assert_allclose(got, want, atol=4e-3)
    v2 = v.copy()
    v2[0] += 1  # key 0 is outside the window of queries 3..6
    got2 = Emulator._fa_ggml(q, k, v2, mask).reshape(T, H, d)
    assert np.array_equal(got2[3:], got[3:]) and not np.array_equal(got2[:3], got[:3])
