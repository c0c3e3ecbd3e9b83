"""models/tensors.check_finite on every block type: a NaN/inf scale (or an E8M0 exponent past the
range fp16 scales give the other types) is a ModelError at load; random valid blocks pass."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.models.errors import ModelError
from edged.models.tensors import check_finite
from edged.quant.scale_fields import E8M0_FIELDS, E8M0_MAX, E8M0_MAX_FINITE, F16_FIELDS, SPLIT_F16
from edged.quant.synth import random_qtensor, set_f16_scale
from edged.quant.tensor import QTensor
from edged.quant.types import SUPPORTED_TYPES, traits

QUANTIZED = [t for t in SUPPORTED_TYPES if traits(t).block_size > 1]


def _poked(qtype, block: int, bits=None, e8m0=None) -> QTensor:
    qt = random_qtensor(qtype, 4, 512, seed=3)
    blocks = qt.data.reshape(-1, traits(qtype).type_size).copy()
    if bits is not None:
        one = blocks[block:block + 1]
        set_f16_scale(qtype, one, np.array([bits], dtype=np.uint16))
        blocks[block] = one[0]
    if e8m0 is not None:
        blocks[block, E8M0_FIELDS[qtype][0]] = e8m0
    return QTensor(qt.name, qt.qtype, qt.shape, blocks.reshape(-1))


def test_every_block_type_has_its_scales_located():
    assert set(QUANTIZED) == set(F16_FIELDS) | set(SPLIT_F16) | set(E8M0_FIELDS)


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_random_valid_blocks_pass(qtype):
    check_finite(random_qtensor(qtype, 4, 512, seed=3), "m.gguf")


@pytest.mark.parametrize("qtype", [*F16_FIELDS, *SPLIT_F16], ids=lambda t: t.name)
@pytest.mark.parametrize("bits", [0x7E00, 0x7C00, 0xFC00], ids=["nan", "inf", "-inf"])
def test_non_finite_fp16_scale_is_refused(qtype, bits):
    with pytest.raises(ModelError, match=rf"\({qtype.name}\) has NaN or infinite block scales"):
        check_finite(_poked(qtype, 5, bits=bits), "m.gguf")


def test_mxfp4_exponent_past_the_bound_is_refused():
    check_finite(_poked(T.MXFP4, 2, e8m0=E8M0_MAX), "m.gguf")  # weights up to 12 * 2^19
    for e in (E8M0_MAX + 1, E8M0_MAX_FINITE, 255):  # 252: finite weights of 2.5e38 (the fuzzer's find)
        with pytest.raises(ModelError, match=r"\(MXFP4\) has block scales past 2\^19 \(E8M0 bytes > 147\)"):
            check_finite(_poked(T.MXFP4, 2, e8m0=e), "m.gguf")


def test_mxfp4_bound_matches_the_dequantizer():
    """E8M0_MAX_FINITE is the last exponent whose largest weight is finite in gguf-py's dequantizer."""
    from gguf.quants import dequantize

    def largest(e):
        blk = np.zeros((1, 17), dtype=np.uint8)
        blk[0, 0], blk[0, 1:] = e, 0x77  # level index 7: the largest magnitude
        return np.abs(dequantize(blk, T.MXFP4)).max()

    with np.errstate(over="ignore"):
        assert np.isfinite(largest(E8M0_MAX_FINITE)) and not np.isfinite(largest(E8M0_MAX_FINITE + 1))
