"""The numpy Q8_K reference (tests/helpers/ggml_quant.py) against its definition."""

import numpy as np

from tests.helpers.ggml_quant import quant_q8_K


def test_q8_K_definition():
    """Per-256: the largest-magnitude value maps to -127 exactly (scale 1/(-127/max)); every value is
    an integer multiple of the scale in [-127, 127] within half a step of x."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[:, 5] *= 40  # an outlier per row, as Gemma's residual stream has
    y = quant_q8_K(x).reshape(3, 2, 256)
    xb = x.reshape(3, 2, 256).astype(np.float64)
    mx = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)
    d = (np.float32(1) / (np.float32(-127) / mx.astype(np.float32))).astype(np.float64)
    q = y / d
    assert np.allclose(q, np.rint(q)) and np.abs(q).max() <= 127
    assert np.allclose(np.take_along_axis(q, np.abs(xb).argmax(-1)[..., None], -1), -127)
    assert np.all(np.abs(y - xb) <= np.abs(d) * 0.5 + 1e-6)
