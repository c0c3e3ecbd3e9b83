"""The matmul dispatcher: one table over every kernel module, input validation, reuse options."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.act_quant import quantize_activations
from edged.quant.tensor import QTensor
from edged.quant.types import TYPE_TRAITS
from tests.helpers.qdata import random_qtensor

mm = sys.modules["edged.backends.cpu.matmul"]

MINE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL]


def test_table_covers_my_types_with_two_kernels():
    for qtype in MINE:
        mm.check_supported(qtype)
        gemv, gemm = mm.kernels_for(qtype)
        assert callable(gemv) and callable(gemm)
    assert set(mm.supported_types()) <= set(TYPE_TRAITS)
    assert set(MINE) <= set(mm.supported_types())


def test_unknown_type_is_a_clear_error():
    # Q8_1 is no weight type edged knows (it is llama.cpp's activation format)
    with pytest.raises(ValueError, match="unsupported tensor type"):
        mm.check_supported(T.Q8_1)
    w = QTensor("w", T.Q8_1, (4, 32), np.zeros(4 * 36, np.uint8))
    with pytest.raises(ValueError, match="Q8_1"):
        mm.matmul(w, np.zeros((1, 32), np.float32))


def test_shape_and_dtype_errors():
    w = random_qtensor(T.Q8_0, 5, 64)
    with pytest.raises(ValueError, match="float32"):
        mm.matmul(w, np.zeros((1, 64), np.float64))
    with pytest.raises(ValueError, match=r"\[n, 64\]"):
        mm.matmul(w, np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match=r"\[n, 64\]"):
        mm.matmul(w, np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="out"):
        mm.matmul(w, np.zeros((2, 64), np.float32), out=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="qx"):
        mm.matmul(w, np.zeros((2, 64), np.float32), qx=quantize_activations(np.zeros((3, 64), np.float32)))
    with pytest.raises(ValueError, match="2-D"):
        mm.matmul(QTensor("w3", T.F32, (2, 2, 32), np.zeros(512, np.uint8)), np.zeros((1, 32), np.float32))
    with pytest.raises(TypeError, match="QTensor"):
        mm.matmul(np.zeros((5, 64), np.float32), np.zeros((1, 64), np.float32))


def test_qx_out_and_empty_batch():
    w = random_qtensor(T.Q5_0, 9, 64, seed=1)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    y = mm.matmul(w, x)
    out = np.empty((4, 9), np.float32)
    assert mm.matmul(w, x, qx=quantize_activations(x), out=out) is out
    np.testing.assert_array_equal(out, y)  # same quantized x, same kernel: bit-identical
    assert mm.matmul(w, np.zeros((0, 64), np.float32)).shape == (0, 9)


def test_non_contiguous_activations():
    w = random_qtensor(T.F16, 6, 64, seed=2)
    xs = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)[:, ::2]  # strided
    np.testing.assert_array_equal(mm.matmul(w, xs), mm.matmul(w, np.ascontiguousarray(xs)))
    wq = random_qtensor(T.Q4_0, 6, 64, seed=2)
    np.testing.assert_array_equal(mm.matmul(wq, xs), mm.matmul(wq, np.ascontiguousarray(xs)))


def test_rows_view_made_once_and_not_a_field():
    w = random_qtensor(T.Q4_0, 6, 64, seed=1)
    assert w.rows() is w.rows()
    assert w.rows().shape == (6, 36)
    twin = type(w)(w.name, w.qtype, w.shape, w.data)
    assert twin == w  # the cached view is no part of equality


def test_matmuls_is_each_matmul_with_one_quantization(monkeypatch):
    """A layer's projections of different types (Q4_K q, Q6_K v, an F32 router): the bits of each
    matmul alone, and x quantized once for the q8_32 weights."""
    ws = [random_qtensor(T.Q4_K, 64, 256, seed=1), random_qtensor(T.Q6_K, 32, 256, seed=2),
          random_qtensor(T.F32, 8, 256, seed=3), random_qtensor(T.Q8_0, 16, 256, seed=4)]
    x = np.random.default_rng(5).standard_normal((3, 256)).astype(np.float32)
    calls = []
    real = mm.quantize_activations
    monkeypatch.setattr(mm, "quantize_activations", lambda a: calls.append(a.shape) or real(a))
    ys = mm.matmuls(ws, x)
    assert calls == [(3, 256)]
    monkeypatch.setattr(mm, "quantize_activations", real)
    for w, y in zip(ws, ys):
        np.testing.assert_array_equal(y, mm.matmul(w, x))
    with pytest.raises(ValueError, match="needs x of shape"):
        mm.matmuls(ws, x[:, :128])
