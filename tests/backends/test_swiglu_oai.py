"""gpt-oss's clamped SwiGLU (swiglu_oai_mul) against a float64 numpy reference.

Bound: max abs error <= 1e-5 * max|ref| (one float32 exp and a few products per element)."""

import numpy as np
import pytest

import tests.helpers.numpy_ops as numpy_ops
from edged.backends.cpu import silu_mul, swiglu_oai_mul


def reference(gate, up, alpha=1.702, limit=7.0):
    x = np.minimum(gate.astype(np.float64), limit)
    y = np.clip(up.astype(np.float64), -limit, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (y + 1.0)


def _inputs(seed=0, n=4, f=300):
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal((n, f)) * 6).astype(np.float32)  # many beyond the limit of 7
    up = (rng.standard_normal((n, f)) * 6).astype(np.float32)
    gate[0, :5] = [-30.0, 30.0, 7.0, 0.0, -7.5]  # exp(alpha * 30) overflows nothing; 30 clamps to 7
    up[0, :5] = [9.0, -9.0, 7.0, -1.0, 0.5]
    return gate, up


@pytest.mark.parametrize("ops", ["cpu", "numpy"])
def test_matches_reference(ops):
    gate, up = _inputs()
    f = swiglu_oai_mul if ops == "cpu" else numpy_ops.swiglu_oai_mul
    y = f(gate, up)
    ref = reference(gate, up)
    assert y.dtype == np.float32 and y.shape == gate.shape
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_clamps_and_differs_from_plain_swiglu():
    gate, up = _inputs(seed=1)
    y = swiglu_oai_mul(gate, up)
    # the gate clamps from above only: a large gate gives limit * sigmoid(alpha * limit) * (y + 1)
    assert y[0, 1] == pytest.approx(7.0 / (1 + np.exp(-1.702 * 7.0)) * (-7.0 + 1.0), rel=1e-6)
    assert y[0, 0] == pytest.approx(-30.0 / (1 + np.exp(1.702 * 30.0)) * 8.0, abs=1e-12)
    small = (np.abs(gate) < 1) & (np.abs(up) < 1)
    assert np.abs(y - silu_mul(gate, up))[small].max() > 1e-2  # sigmoid(1.702 x) and the +1 matter


def test_custom_constants_and_out():
    gate, up = _inputs(seed=2)
    out = np.empty_like(gate)
    assert swiglu_oai_mul(gate, up, out=out, alpha=1.0, limit=3.0) is out
    assert np.abs(out - reference(gate, up, 1.0, 3.0)).max() <= 1e-5 * np.abs(reference(gate, up, 1.0, 3.0)).max()
    with pytest.raises(ValueError, match="swiglu_oai_mul"):
        swiglu_oai_mul(gate, up[:, :-1])
