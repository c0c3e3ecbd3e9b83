"""CUDA matmul (simulator, tiny shapes) against the CPU backend and gguf-py + numpy, every type,
both kernels (mat-vec n <= 8, tiled n > 8)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.backends.cuda.checks import ALL_TYPES, check_act_quant, check_matmul, ops, weight


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_matches_cpu_and_reference(qtype):
    # m = 5: a partial mat-vec block (4 rows per block) and a partial tile; n 1, 3 mat-vec, 9 tiled
    check_matmul(qtype, m=5, k=256, ns=(1, 3, 9))


@pytest.mark.parametrize("qtype", [T.Q8_0, T.F16], ids=lambda t: t.name)
def test_matmul_row_width_not_a_multiple_of_the_stage(qtype):
    check_matmul(qtype, m=3, k=96, ns=(2, 9), seed=1)  # 3 blocks: partial warp step and tile stage


def test_matmul_two_superblocks():
    check_matmul(T.Q4_K, m=2, k=512, ns=(1,), seed=2)


def test_activation_quantization_is_bit_identical_to_cpu():
    check_act_quant(n=3, k=96)


def test_unsupported_and_bad_inputs_are_clear_errors():
    o = ops()
    with pytest.raises(ValueError, match="Q8_1"):
        o.check_supported(T.Q8_1)
    wd = o.upload_matrix(weight(T.Q8_0, 2, 64))
    with pytest.raises(ValueError, match=r"\[n, 64\]"):
        o.matmul(wd, np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        o.matmul(wd, o.upload(np.zeros((1, 64), np.float64)))
    with pytest.raises(TypeError, match="DeviceMatrix"):
        o.matmul(weight(T.Q8_0, 2, 64), np.zeros((1, 64), np.float32))
    assert o.matmul(wd, np.zeros((0, 64), np.float32)).shape == (0, 2)


def test_upload_matrix_keeps_the_raw_blocks():
    o = ops()
    w = weight(T.Q6_K, 3, 256)
    wd = o.upload_matrix(w)
    assert (wd.name, wd.qtype, wd.shape) == ("w", T.Q6_K, (3, 256))
    assert wd.rows.dtype == np.uint8 and tuple(wd.rows.shape) == (3, 210)
    np.testing.assert_array_equal(o.to_host(wd.rows), w.rows())


def test_numpy_quantization_reference_is_the_cpus():
    from edged.backends.cpu.act_quant import quantize_activations as cpu_quantize
    from tests.backends.cuda.checks import np_quantize

    x = np.random.default_rng(5).standard_normal((4, 128)).astype(np.float32)
    x[0, :32] = np.arange(32, dtype=np.float32) - 15.5
    x[1, 32:64] = 0.0
    for a, b in zip(np_quantize(x), cpu_quantize(x)):
        np.testing.assert_array_equal(a, b)
