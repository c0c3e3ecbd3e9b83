"""edged.quant.iq_grids: the low-bit lookup tables decoded from gguf-py's packed grids, checked against
gguf-py's own decoder and against the first entries of llama.cpp's ggml-common.h tables."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from edged.quant import iq_grids as g

GRIDS = [
    ("IQ2XXS_GRID", gq.IQ2_XXS, np.uint8, (256, 8)),
    ("IQ2XS_GRID", gq.IQ2_XS, np.uint8, (512, 8)),
    ("IQ2S_GRID", gq.IQ2_S, np.uint8, (1024, 8)),
    ("IQ3XXS_GRID", gq.IQ3_XXS, np.uint8, (256, 4)),
    ("IQ3S_GRID", gq.IQ3_S, np.uint8, (512, 4)),
    ("IQ1S_GRID", gq.IQ1_S, np.int8, (2048, 8)),
]


@pytest.mark.parametrize("name,cls,dtype,shape", GRIDS, ids=[n for n, *_ in GRIDS])
def test_grid_matches_gguf_decode(name, cls, dtype, shape):
    grid = getattr(g, name)
    assert grid.dtype == dtype and grid.shape == shape and grid.flags.c_contiguous
    cls.init_grid()  # gguf-py's own decoder: float32 [1, 1, entries, width]
    np.testing.assert_array_equal(grid.astype(np.float32), cls.grid.reshape(shape))
    assert len(np.unique(grid.view(np.dtype((np.void, grid.shape[1]))))) == shape[0], "entries are distinct"


def _le_bytes(words, width):
    """llama.cpp's table literals (little-endian uint32/uint64 words) -> uint8 [len, width]."""
    dt = np.uint64 if width == 8 else np.uint32
    return np.array(words, dtype=dt).view(np.uint8).reshape(len(words), width)


def test_first_entries_are_llama_cpp_literals():
    # iq2xxs_grid / iq3xxs_grid / iq1s_grid opening words in ggml-common.h
    np.testing.assert_array_equal(
        g.IQ2XXS_GRID[:4], _le_bytes([0x0808080808080808, 0x080808080808082B, 0x0808080808081919, 0x0808080808082B08], 8)
    )
    np.testing.assert_array_equal(g.IQ3XXS_GRID[:4], _le_bytes([0x04040404, 0x04040414, 0x04040424, 0x04040C0C], 4))
    np.testing.assert_array_equal(
        g.IQ1S_GRID[:3].view(np.uint8), _le_bytes([0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFF01, 0xFFFFFFFFFFFF0000], 8)
    )


def test_levels():
    assert set(np.unique(g.IQ2XXS_GRID)) == set(np.unique(g.IQ2S_GRID)) == {8, 25, 43}
    assert set(np.unique(g.IQ3XXS_GRID)) == {4, 12, 20, 28, 36, 44, 52, 62}
    assert set(np.unique(g.IQ3S_GRID)) == {1, 3, 5, 7, 9, 11, 13, 15}
    assert set(np.unique(g.IQ1S_GRID)) == {-1, 0, 1}
    assert g.IQ1S_DELTA == 0.125


def test_sign_tables():
    assert g.KSIGNS_IQ2XS.dtype == np.uint8 and g.KSIGNS_IQ2XS.shape == (128,)
    i = np.arange(128)
    # low 7 bits are the index itself; bit 7 makes the number of negative signs even
    np.testing.assert_array_equal(g.KSIGNS_IQ2XS & 0x7F, i)
    ones = np.unpackbits(g.KSIGNS_IQ2XS[:, None], axis=1).sum(axis=1)
    assert np.all(ones % 2 == 0)
    assert g.KMASK_IQ2XS.dtype == np.uint8 and g.KMASK_IQ2XS.tolist() == [1, 2, 4, 8, 16, 32, 64, 128]


def test_mxfp4_values():
    assert g.MXFP4_VALUES.dtype == np.int8 and g.MXFP4_VALUES.shape == (16,)
    # doubled E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (index bit 3 is the sign)
    assert g.MXFP4_VALUES.tolist() == [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]


@pytest.mark.parametrize(
    "qtype,const,block",
    [
        (T.IQ2_XXS, g.IQ2_XXS_BYTES, g.QK_K), (T.IQ2_XS, g.IQ2_XS_BYTES, g.QK_K), (T.IQ2_S, g.IQ2_S_BYTES, g.QK_K),
        (T.IQ3_XXS, g.IQ3_XXS_BYTES, g.QK_K), (T.IQ3_S, g.IQ3_S_BYTES, g.QK_K), (T.IQ1_S, g.IQ1_S_BYTES, g.QK_K),
        (T.IQ1_M, g.IQ1_M_BYTES, g.QK_K), (T.TQ1_0, g.TQ1_0_BYTES, g.QK_K), (T.TQ2_0, g.TQ2_0_BYTES, g.QK_K),
        (T.MXFP4, g.MXFP4_BYTES, g.QK_MXFP4),
    ],
    ids=lambda x: x.name if isinstance(x, T) else None,
)
def test_block_geometry_matches_gguf(qtype, const, block):
    assert GGML_QUANT_SIZES[qtype] == (block, const)
