"""Small ops run in the calling thread (kernel_threads.SERIAL_ELEMENTS) and larger ones in the thread
pool: both paths compile the same loop body, so a row's bits must not depend on which one ran."""

import numpy as np
import pytest

from edged.backends.base import KV_TYPES, RopeParams
from edged.backends.cpu import (
    allocate_kv, gelu_tanh_mul, moe_combine, rms_norm, rope, silu_mul, softcap, store_kv, swiglu_oai_mul,
)
from edged.backends.cpu.act_quant import quantize_activations
from edged.backends.cpu.kernel_threads import SERIAL_ELEMENTS, runs_serial

D = 1024
N = SERIAL_ELEMENTS // D + 8  # rows of the batch: past the serial limit, one row well within it


def _x(n=N, d=D, seed=0, spread=4.0):
    x = (np.random.default_rng(seed).standard_normal((n, d)) * spread).astype(np.float32)
    x[0, :6] = [-100.0, 100.0, 0.0, -0.0, 1e-30, -88.0]  # exp's clamp and sign cases
    return x


def _rows_alone(op, *arrays):
    """op over each row of the arrays by itself (the serial path), stacked."""
    return np.concatenate([op(*(a[t : t + 1] for a in arrays)) for t in range(arrays[0].shape[0])])


ELEMENTWISE = {
    "rms_norm": lambda x: rms_norm(x, np.linspace(0.5, 1.5, x.shape[1], dtype=np.float32), 1e-6),
    "silu_mul": lambda x: silu_mul(x, x[:, ::-1].copy()),
    "gelu_tanh_mul": lambda x: gelu_tanh_mul(x, x[:, ::-1].copy()),
    "gelu_tanh_mul fp16": lambda x: gelu_tanh_mul(x, x[:, ::-1].copy(), ggml_fp16=True),
    "swiglu_oai_mul": lambda x: swiglu_oai_mul(x, x[:, ::-1].copy()),
    "softcap": lambda x: softcap(x, 30.0),
    "quantize_activations": lambda x: np.concatenate([a.reshape(x.shape[0], -1).view(np.uint8)
                                                      for a in quantize_activations(x)], axis=1),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_rowwise_ops_same_bits_serial_and_parallel(name):
    op = ELEMENTWISE[name]
    x = _x()
    assert not runs_serial(x) and runs_serial(x[:1])  # both paths run below
    assert np.array_equal(op(x), _rows_alone(op, x), equal_nan=True)


def test_silu_matches_float64_with_the_vector_exp():
    """silu through the vectorizable exp: within a few float32 ulps of the float64 formula, on both
    paths, including the clamped tail (x = -100 gives ~0, not NaN)."""
    x = _x()
    up = np.ones_like(x)
    g = x.astype(np.float64)
    want = g / (1.0 + np.exp(-g))
    for got in (silu_mul(x, up), silu_mul(x[:1], up[:1])):
        w = want[: got.shape[0]]
        assert np.all(np.isfinite(got))
        assert np.abs(got - w).max() <= 4e-7 * np.abs(w).max()


def test_rope_same_bits_serial_and_parallel():
    p = RopeParams(dim=64, freq_base=10000.0, neox=True)
    q = _x(N * 4, 4 * 64).reshape(N * 4, 4, 64)
    pos = np.arange(q.shape[0], dtype=np.int32) * 37
    assert not runs_serial(q) and runs_serial(q[:1])
    alone = np.concatenate([rope(q[t : t + 1], pos[t : t + 1], p) for t in range(q.shape[0])])
    assert np.array_equal(rope(q, pos, p), alone)


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_store_kv_same_bits_serial_and_parallel(kv_type):
    n, kvh, hd = 160, 2, 64  # 160 x 2 x 64 > SERIAL_ELEMENTS
    k = _x(n, kvh * hd, seed=1).reshape(n, kvh, hd)
    v = _x(n, kvh * hd, seed=2).reshape(n, kvh, hd)
    assert not runs_serial(k) and runs_serial(k[:1])
    slots = np.random.default_rng(3).permutation(n + 32)[:n].astype(np.int32)
    batch, alone = allocate_kv(12, 16, kvh, hd, kv_type), allocate_kv(12, 16, kvh, hd, kv_type)
    store_kv(batch, k, v, slots)
    for t in range(n):
        store_kv(alone, k[t : t + 1], v[t : t + 1], slots[t : t + 1])
    for a, b in ((batch.k, alone.k), (batch.v, alone.v), (batch.k_scale, alone.k_scale)):
        if a is not None:
            assert np.array_equal(a, b)


def test_moe_combine_same_bits_serial_and_parallel():
    y = _x(60, D, seed=4)
    src = np.random.default_rng(5).integers(0, 60, (N, 3)).astype(np.int32)
    w = np.random.default_rng(6).standard_normal((N, 3)).astype(np.float32)
    assert not runs_serial(np.empty((N, D))) and runs_serial(np.empty((1, D)))
    alone = np.concatenate([moe_combine([y], src[t : t + 1], w[t : t + 1]) for t in range(N)])
    assert np.array_equal(moe_combine([y], src, w), alone)
