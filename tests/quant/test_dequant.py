"""Every supported type's Numba dequantizer is bit-exact to gguf-py's (tests.helpers.qdata)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.quant import dequantize, load_gguf
from edged.quant.dequant import DEQUANTIZERS, dequantize_rows
from edged.quant.tensor import QTensor
from edged.quant.types import SUPPORTED_TYPES, traits
from tests.helpers.model import default_model_path
from edged.quant.synth import F16_SCALED, set_e8m0_scale, set_f16_scale
from tests.helpers.qdata import random_qtensor, reference_dequantize


def _shapes(qtype):
    """(rows, cols): 1, 2, 3 blocks per row with 1 and odd row counts, a 640- and a 2048-wide row."""
    bs = traits(qtype).block_size
    shapes = [(1, bs), (3, 2 * bs), (5, 3 * bs), (2, 2048)]
    if 640 % bs == 0:
        shapes.append((3, 640))
    return shapes


CASES = [(t, s) for t in SUPPORTED_TYPES for s in _shapes(t)]


def assert_bits_equal(a: np.ndarray, b: np.ndarray):
    """Same shape, dtype float32 and identical bit patterns (so -0.0 and NaN payloads count)."""
    assert a.dtype == np.float32 and b.dtype == np.float32
    assert a.shape == b.shape
    diff = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
    assert diff.size == 0, f"{diff.size} elements differ, first at {diff[0]}: {a.flat[diff[0]]!r} vs {b.flat[diff[0]]!r}"


def test_table_covers_supported_types():
    assert set(DEQUANTIZERS) == set(SUPPORTED_TYPES)
    assert len(SUPPORTED_TYPES) == 25


@pytest.mark.parametrize("qtype,shape", CASES, ids=[f"{t.name}-{r}x{c}" for t, (r, c) in CASES])
def test_random_blocks_bit_exact(qtype, shape):
    w = random_qtensor(qtype, *shape, seed=shape[0] * 7 + shape[1])
    assert_bits_equal(dequantize(w), reference_dequantize(w))


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_all_16bit_patterns(qtype):
    # every pattern once: ±0, subnormals, ±inf, quiet and signalling NaNs with payloads
    data = np.arange(65536, dtype=np.uint16).view(np.uint8)
    w = QTensor("all", qtype, (64, 1024), data)
    assert_bits_equal(dequantize(w), reference_dequantize(w))


def test_f32_special_values():
    bits = np.array(
        [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
         0xFFC12345, 0x3F800000, 0x7F7FFFFF, 0x00800000],
        dtype=np.uint32,
    )
    w = QTensor("f32", T.F32, (3, 4), bits.view(np.uint8))
    out = dequantize(w)
    assert_bits_equal(out, reference_dequantize(w))
    assert out.view(np.uint32).reshape(-1).tolist() == bits.tolist()


@pytest.mark.parametrize("qtype", F16_SCALED, ids=lambda t: t.name)
def test_special_fp16_scales(qtype):
    # scale fields set to -0, a subnormal, the largest fp16, inf and NaN: same result as gguf-py
    w = random_qtensor(qtype, 5, traits(qtype).block_size, seed=3)
    blocks = w.data.reshape(5, -1).copy()
    set_f16_scale(qtype, blocks, np.array([0x8000, 0x0001, 0x7BFF, 0x7C00, 0x7E01], dtype=np.uint16))
    w = QTensor("s", qtype, w.shape, blocks.reshape(-1))
    with np.errstate(invalid="ignore"):  # gguf-py computes inf * 0
        ref = reference_dequantize(w)
    np.testing.assert_array_equal(dequantize(w), ref)  # NaN == NaN here


def test_block_scaled_types_all_have_a_scale_writer():
    # every block type but MXFP4 (an E8M0 exponent byte) has an fp16 scale the tests can set
    assert set(F16_SCALED) | {T.MXFP4} == {t for t in SUPPORTED_TYPES if traits(t).block_size > 1}


def test_mxfp4_e8m0_edge_exponents():
    # e = 0 and 1 decode to float32 subnormals, 254 and 255 to 2^126 and 2^127 (x12 overflows to inf)
    w = random_qtensor(T.MXFP4, 8, 64, seed=4)
    blocks = w.data.reshape(16, -1).copy()
    set_e8m0_scale(T.MXFP4, blocks, np.array([0, 1, 2, 127, 128, 200, 254, 255] * 2, dtype=np.uint8))
    w = QTensor("e", T.MXFP4, w.shape, blocks.reshape(-1))
    with np.errstate(over="ignore"):
        ref = reference_dequantize(w)
    assert_bits_equal(dequantize(w), ref)
    assert np.isinf(ref).any() and ((ref != 0) & (np.abs(ref) < np.finfo(np.float32).tiny)).any()


LOW_BIT = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.MXFP4]


@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x55, 0xAA], ids=lambda f: f"{f:#04x}")
@pytest.mark.parametrize("qtype", LOW_BIT, ids=lambda t: t.name)
def test_low_bit_edge_blocks(qtype, fill):
    # every index/sign/scale bit equal: all-zero blocks (zero scale too), max indices and all signs set
    # (0xFF), alternating bits; then the same quant bits under a positive and a negative scale
    bs, ts = traits(qtype).block_size, traits(qtype).type_size
    blocks = np.full((4, ts), fill, dtype=np.uint8)
    cases = [blocks.copy()]
    if fill:
        for sign in (1, -1):
            b = blocks.copy()
            if qtype == T.MXFP4:
                set_e8m0_scale(qtype, b, np.array([120, 121, 122, 123], dtype=np.uint8))
            else:
                set_f16_scale(qtype, b, (sign * np.array([0.01, 0.02, 0.5, 3.0])).astype(np.float16).view(np.uint16))
            cases.append(b)
    for b in cases:
        w = QTensor("edge", qtype, (4, bs), b.reshape(-1))
        out = dequantize(w)
        with np.errstate(invalid="ignore", over="ignore"):
            ref = reference_dequantize(w)
        if np.isnan(ref).any():  # 0xFF as the scale is a NaN: values agree, a NaN's sign bit may not
            np.testing.assert_array_equal(out, ref)
        else:
            assert_bits_equal(out, ref)
        if fill == 0 and qtype != T.MXFP4:
            assert not out.any()  # a zero scale zeroes the block (MXFP4's e = 0 is 2^-128, not zero)


def test_row_selection():
    w = random_qtensor(T.Q4_K, 9, 512, seed=5)
    ref = reference_dequantize(w)
    assert_bits_equal(dequantize(w, slice(2, 7)), ref[2:7])
    assert_bits_equal(dequantize(w, slice(None, None, 3)), ref[::3])
    ids = np.array([8, 0, 3, 3], dtype=np.int32)
    assert_bits_equal(dequantize(w, ids), ref[ids])
    assert dequantize(w, np.array([], dtype=np.int64)).shape == (0, 512)


@pytest.mark.parametrize("rows", [np.array([0, 9]), np.array([-1]), np.array([0.5]), np.array([[1]])])
def test_bad_rows_rejected(rows):
    w = random_qtensor(T.Q8_0, 9, 64)
    with pytest.raises(ValueError, match="row"):
        dequantize(w, rows)


def test_out_of_range_row_named():
    w = random_qtensor(T.Q8_0, 9, 64)
    with pytest.raises(ValueError, match=r"\b9\b"):
        dequantize(w, np.array([1, 9, 2]))


def test_one_dimensional_tensor_keeps_shape():
    w = random_qtensor(T.F32, 1, 640)
    w = QTensor("norm", T.F32, (640,), w.data)
    assert dequantize(w).shape == (640,)


def test_unsupported_type_names_it():
    w = QTensor("q81", T.Q8_1, (1, 32), np.zeros(36, dtype=np.uint8))
    with pytest.raises(ValueError, match="Q8_1"):
        dequantize(w)
    with pytest.raises(ValueError, match="Q8_1"):
        dequantize_rows(T.Q8_1, np.zeros((1, 36), dtype=np.uint8), 32)


def test_wrong_row_bytes_rejected():
    with pytest.raises(ValueError, match="Q4_0"):
        dequantize_rows(T.Q4_0, np.zeros((2, 17), dtype=np.uint8), 32)


@pytest.fixture(scope="module")
def model():
    gf = load_gguf(default_model_path())
    yield gf
    gf.close()


def _first_of(model, qtype):
    return next(t for t in model.tensors.values() if t.qtype == qtype)


@pytest.mark.parametrize("qtype", [T.F32, T.Q5_0, T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_real_model_tensor_bit_exact(model, qtype):
    w = _first_of(model, qtype)
    if w.name == "token_embd.weight":  # 262144 rows: compare a slice, not 670 MB of floats
        w = QTensor(w.name, w.qtype, (1000, w.n_cols), w.rows()[-1000:].reshape(-1))
    assert_bits_equal(dequantize(w), reference_dequantize(w))
