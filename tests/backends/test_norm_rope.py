"""rms_norm and rope against float64 numpy references.

Bounds: rms_norm max abs error <= 2e-6 * max|y| (float32 scaling of a float64-exact mean);
rope <= 2e-5 for |x| ~ 1 and positions < 200 (llama.cpp's angles come from repeated float32
products, so they drift from the exact angle by a few ulps per frequency step).
"""

import numpy as np
import pytest

from edged.backends.base import RopeParams
from edged.backends.cpu import rms_norm, rope


def ref_rms_norm(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + eps) * w.astype(np.float64)


def ref_rope(x, positions, p: RopeParams):
    """Rotate pairs of the first p.dim features by pos * freq_scale * base^(-2i/dim) / factor_i."""
    y = x.astype(np.float64).copy()  # [n, heads, hd]
    half = p.dim // 2
    i = np.arange(half, dtype=np.float64)
    inv_freq = p.freq_base ** (-2.0 * i / p.dim)
    if p.freq_factors is not None:
        inv_freq = inv_freq / p.freq_factors.astype(np.float64)
    theta = positions.astype(np.float64)[:, None] * p.freq_scale * inv_freq[None, :]  # [n, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if p.neox:
        i0, i1 = np.arange(half), np.arange(half) + half
    else:
        i0, i1 = 2 * np.arange(half), 2 * np.arange(half) + 1
    x0, x1 = y[:, :, i0].copy(), y[:, :, i1].copy()
    y[:, :, i0] = x0 * cos - x1 * sin
    y[:, :, i1] = x0 * sin + x1 * cos
    return y


@pytest.mark.parametrize("n,d", [(1, 640), (7, 256), (3, 33)])
def test_rms_norm_matches_reference(n, d):
    rng = np.random.default_rng(n * d)
    x = (rng.standard_normal((n, d)) * 3).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    y = rms_norm(x, w, 1e-6)
    ref = ref_rms_norm(x, w, 1e-6)
    assert y.dtype == np.float32 and y.shape == (n, d)
    assert np.abs(y - ref).max() <= 2e-6 * np.abs(ref).max()


def test_rms_norm_eps_dominates_tiny_rows_and_in_place():
    x = np.full((2, 8), 1e-4, dtype=np.float32)
    w = np.ones(8, dtype=np.float32)
    ref = ref_rms_norm(x, w, 1e-2)
    y = rms_norm(x, w, 1e-2, out=x)
    assert y is x
    np.testing.assert_allclose(x, ref, rtol=1e-6)


def test_rms_norm_rejects_bad_shapes():
    with pytest.raises(ValueError, match="weight"):
        rms_norm(np.zeros((2, 8), np.float32), np.ones(7, np.float32), 1e-6)
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        rms_norm(np.zeros(8, np.float32), np.ones(8, np.float32), 1e-6)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(
    "hd,dim,freq_scale,with_factors",
    [(64, 64, 1.0, False), (64, 32, 1.0, False), (128, 128, 0.25, True), (80, 48, 0.5, True)],
)
def test_rope_matches_reference(neox, hd, dim, freq_scale, with_factors):
    rng = np.random.default_rng(hd + dim + int(neox))
    n, heads = 6, 3
    x = rng.standard_normal((n, heads, hd)).astype(np.float32)
    positions = np.array([0, 1, 5, 17, 100, 199], dtype=np.int32)
    factors = rng.uniform(1.0, 8.0, dim // 2).astype(np.float32) if with_factors else None
    p = RopeParams(dim=dim, freq_base=10000.0, neox=neox, freq_scale=freq_scale, freq_factors=factors)
    y = rope(x, positions, p)
    ref = ref_rope(x, positions, p)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.abs(y - ref).max() <= 2e-5
    np.testing.assert_array_equal(y[:, :, dim:], x[:, :, dim:])  # unrotated tail copied
    np.testing.assert_array_equal(y[0], x[0])  # position 0 is the identity


def test_rope_pairs_differ_between_modes_and_in_place():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, 16)).astype(np.float32)
    pos = np.array([3, 9], dtype=np.int32)
    neox = rope(x, pos, RopeParams(16, 10000.0, True))
    normal = rope(x, pos, RopeParams(16, 10000.0, False))
    assert np.abs(neox - normal).max() > 0.1
    x2 = x.copy()
    assert rope(x2, pos, RopeParams(16, 10000.0, True), out=x2) is x2
    np.testing.assert_array_equal(x2, neox)


def test_rope_rejects_bad_params():
    x = np.zeros((2, 1, 16), np.float32)
    pos = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="dim"):
        rope(x, pos, RopeParams(18, 10000.0, True))
    with pytest.raises(ValueError, match="freq_factors"):
        rope(x, pos, RopeParams(16, 10000.0, True, freq_factors=np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="positions"):
        rope(x, pos[:1], RopeParams(16, 10000.0, True))


def test_rope_theta_scale_rounds_as_llamacpp_powf():
    from edged.backends.rope import rope_theta_scale

    # powf(base, -2.0f / n_dims) in float32: the exponent is rounded to float32 before the power
    for dim, base in ((128, 10000.0), (64, 500000.0), (80, 1e6)):
        want = np.float32(np.float32(base) ** np.float64(np.float32(-2.0) / np.float32(dim)))
        assert rope_theta_scale(dim, base) == want


def test_cuda_backend_imports_nothing_of_the_cpu_backend():
    """Shared math lives in edged.backends (base.py, rope.py); backends/cuda never reaches into cpu."""
    import ast
    from pathlib import Path

    import edged.backends

    cuda_dir = Path(edged.backends.__path__[0]) / "cuda"
    for path in sorted(cuda_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            bad = [n for n in names if n.startswith("edged.backends.cpu")]
            assert not bad, f"{path.name} imports {bad}"
