"""Gated activations and softcap against float64 numpy references (max abs error <= 1e-5 * scale)."""

import numpy as np
import pytest

from edged.backends.cpu import add, gelu_tanh_mul, scale, silu_mul, softcap


def ref_gelu_tanh(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _inputs(n=5, f=300, seed=0):
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal((n, f)) * 4).astype(np.float32)
    gate[0, :4] = [-12.0, 12.0, 0.0, -0.0]
    up = rng.standard_normal((n, f)).astype(np.float32)
    return gate, up


def test_gelu_tanh_mul_matches_reference():
    gate, up = _inputs()
    y = gelu_tanh_mul(gate, up)
    ref = ref_gelu_tanh(gate) * up
    assert y.dtype == np.float32 and y.shape == gate.shape
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_gelu_ggml_fp16_matches_float16_rounding():
    """llama.cpp's table path: gelu(fp16(x)) rounded to fp16; identity/zero past |x| >= 10."""
    gate, up = _inputs(seed=1)
    # ties and float16 subnormals exercise the rounding of the float32 -> float16 conversion
    gate[1, :6] = [1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 3e-6, -2.0**-24 * 1.5, 6.0e-5, 9.99]
    xh = gate.astype(np.float16).astype(np.float32)
    # ggml builds its table in float32 (1 + tanh cancels for x << 0, so float64 would differ)
    c, a = np.float32(np.sqrt(2.0 / np.pi)), np.float32(0.044715)
    gelu32 = np.float32(0.5) * xh * (np.float32(1) + np.tanh(c * xh * (np.float32(1) + a * xh * xh)))
    table_val = gelu32.astype(np.float16).astype(np.float32)
    g = np.where(gate <= -10, 0.0, np.where(gate >= 10, gate, table_val)).astype(np.float32)
    y = gelu_tanh_mul(gate, up, ggml_fp16=True)
    np.testing.assert_allclose(y, g * up, rtol=1e-6, atol=1e-12)
    # and it stays close to the exact formula
    assert np.abs(y - ref_gelu_tanh(gate) * up).max() < 2e-2


def test_silu_mul_matches_reference():
    gate, up = _inputs(seed=2)
    y = silu_mul(gate, up)
    g64 = gate.astype(np.float64)
    ref = g64 / (1.0 + np.exp(-g64)) * up
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_softcap_add_scale():
    gate, up = _inputs(seed=3)
    y = softcap(gate * 10, 30.0)
    ref = 30.0 * np.tanh(gate.astype(np.float64) * 10 / 30.0)
    assert np.abs(y - ref).max() <= 1e-5 * 30
    assert np.abs(y).max() < 30.0
    np.testing.assert_array_equal(add(gate, up), gate + up)
    a = gate.copy()
    assert add(a, up, out=a) is a
    np.testing.assert_allclose(scale(gate, 25.3), gate * np.float32(25.3), rtol=1e-7)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="gate"):
        gelu_tanh_mul(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="cap"):
        softcap(np.zeros((2, 3), np.float32), 0.0)
    with pytest.raises(ValueError, match="shapes"):
        add(np.zeros(3, np.float32), np.zeros(4, np.float32))


@pytest.mark.parametrize("n", [1, 5, 40])  # 40 x 300: past the serial threshold, the thread-pool kernel
@pytest.mark.parametrize("op", ["gelu_tanh", "gelu_fp16", "silu", "swiglu_oai"])
def test_gated_ops_read_fused_halves_in_place(op, n):
    """gate | up as the two column halves of one fused matmul output (slice_cols' views): the same
    bits as from contiguous copies, read without copying them."""
    from edged.backends.cpu import slice_cols, swiglu_oai_mul
    from edged.backends.cpu.activations import _columns_of

    fn = {"gelu_tanh": gelu_tanh_mul, "gelu_fp16": lambda g, u: gelu_tanh_mul(g, u, ggml_fp16=True),
          "silu": silu_mul, "swiglu_oai": swiglu_oai_mul}[op]
    gate, up = _inputs(n=n)
    gu = np.concatenate([gate, up], axis=1)  # [n, 2f]
    g, u = slice_cols(gu, 0, 300), slice_cols(gu, 300, 600)
    assert _columns_of(g)[0] is gu and _columns_of(u) == (gu, 300) or n == 1
    assert np.array_equal(fn(g, u), fn(gate, up))
    # other views are copied first
    assert np.array_equal(fn(up[:, ::2], gate[:, ::2]), fn(up[:, ::2].copy(), gate[:, ::2].copy()))
