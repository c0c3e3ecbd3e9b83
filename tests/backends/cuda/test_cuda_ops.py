"""CUDA embed, norms, rope, elementwise ops and transfers (simulator) against the CPU backend."""

import numpy as np
import pytest

from tests.backends.cuda.checks import ALL_TYPES, check_elementwise, check_embed, check_rms_norm, check_rope, ops, weight


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_embed_matches_dequantize(qtype):
    check_embed(qtype, m=4, k=256, ids=[3, 0, 3, 1])


def test_embed_bad_id_is_an_error():
    o = ops()
    from gguf import GGMLQuantizationType as T

    wd = o.upload_matrix(weight(T.Q4_0, 4, 64))
    with pytest.raises(ValueError, match="token id 4 out of range"):
        o.embed(wd, np.array([0, 4], np.int32))


@pytest.mark.parametrize("d", [64, 200])
def test_rms_norm(d):
    check_rms_norm(n=3, d=d)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("dim,factors", [(16, False), (12, True)])
def test_rope(neox, dim, factors):
    check_rope(n=3, heads=2, hd=16, dim=dim, neox=neox, factors=factors)


def test_rope_uploads_its_table_once():
    o = ops()
    from edged.backends.base import RopeParams

    ff = np.ones(4, np.float32)
    p = RopeParams(dim=8, freq_base=10000.0, neox=True, freq_factors=ff)
    x = o.upload(np.ones((1, 1, 8), np.float32))
    o.rope(x, np.zeros(1, np.int32), p)
    dev = p.__dict__["_device_table"][1]
    o.rope(x, np.zeros(1, np.int32), p)
    assert p.__dict__["_device_table"][1] is dev
    p.freq_factors = np.full(4, 2.0, np.float32)  # a changed field rebuilds the table
    o.rope(x, np.zeros(1, np.int32), p)
    assert p.__dict__["_device_table"][1] is not dev


def test_rope_yarn():
    check_rope(n=3, heads=2, hd=16, dim=16, neox=True, factors=False, yarn=True)


def test_elementwise_and_copies():
    check_elementwise(n=3, f=40)


def test_bad_shapes_are_clear_errors():
    o = ops()
    a = o.upload(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="add"):
        o.add(a, o.upload(np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="gate"):
        o.silu_mul(a, o.upload(np.zeros((2, 5), np.float32)))
    with pytest.raises(ValueError, match="out of range"):
        o.take_rows(a, np.array([2], np.int32))
    with pytest.raises(ValueError, match="columns"):
        o.slice_cols(a, 3, 5)
    with pytest.raises(ValueError, match="weight shape"):
        o.rms_norm(a, np.ones(3, np.float32), 1e-6)


def test_transfers_and_memory():
    o = ops()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous: upload copies
    np.testing.assert_array_equal(o.to_host(o.upload(x)), x)
    free, total = o.device_memory()
    assert isinstance(free, int) and isinstance(total, int) and 0 < free <= total


def test_upload_of_a_device_array_is_that_array():
    o = ops()
    d = o.upload(np.zeros(3, np.float32))
    assert o.upload(d) is d
