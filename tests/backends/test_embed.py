"""embed(w, ids): row gather + dequantize, bit-exact to gguf-py for every supported type."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.embed import embed
from edged.quant import load_gguf
from edged.quant.tensor import QTensor
from edged.quant.types import SUPPORTED_TYPES, traits
from tests.helpers.model import default_model_path
from tests.helpers.qdata import random_qtensor, reference_dequantize


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_embed_equals_reference_rows(qtype):
    w = random_qtensor(qtype, 7, 2 * max(traits(qtype).block_size, 32), seed=11)
    ids = np.array([6, 0, 3, 3, 1], dtype=np.int32)  # unordered, repeated
    out = embed(w, ids)
    ref = reference_dequantize(w)[ids]
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("bad", [7, -1, 1 << 40])
def test_out_of_range_id_raises_naming_it(bad):
    w = random_qtensor(T.Q8_0, 7, 64)
    with pytest.raises(ValueError, match=f"token id {bad} out of range"):
        embed(w, np.array([0, bad, 2], dtype=np.int64))


@pytest.mark.parametrize("ids", [np.array([[1, 2]]), np.array([1.0])])
def test_bad_id_arrays_rejected(ids):
    w = random_qtensor(T.Q8_0, 7, 64)
    with pytest.raises(ValueError, match="token ids"):
        embed(w, ids)


def test_empty_ids():
    w = random_qtensor(T.Q4_0, 7, 64)
    assert embed(w, np.array([], dtype=np.int32)).shape == (0, 64)


def test_real_token_embedding_rows():
    gf = load_gguf(default_model_path())
    try:
        w = gf.tensors["token_embd.weight"]  # Q8_0 [262144, 640]
        ids = np.array([2, 0, 262143, 105, 9259], dtype=np.int32)
        sub = QTensor("sub", w.qtype, (len(ids), w.n_cols), np.ascontiguousarray(w.rows()[ids]).reshape(-1))
        out = embed(w, ids)
        assert out.shape == (5, 640)
        assert np.array_equal(out.view(np.uint32), reference_dequantize(sub).view(np.uint32))
    finally:
        gf.close()
