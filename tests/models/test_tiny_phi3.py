"""Tiny Phi-3 (fused attn_qkv and gate|up ffn_up) against the float64 reference forward."""

import pytest

from tests.helpers.tiny_models import write_tiny_model
from tests.models.tiny_checks import (BACKENDS, TinyCase, check_decode, check_mixed_batch,
                                      check_prefill)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return TinyCase(write_tiny_model(tmp_path_factory.mktemp("phi3") / "m.gguf", "phi3"))


@pytest.fixture(scope="module")
def other(case):
    return TinyCase(case.path, n_tokens=10, seed=7)


def test_loaded(case):
    model = case.model("numpy")
    lw = model.layers[0]
    assert lw.attn.wqkv.shape == (192, 64) and lw.attn.wq is None
    assert lw.ffn.gate is None and lw.ffn.up.shape == (512, 64)
    assert lw.rope.neox and lw.window == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill(case, backend):
    check_prefill(case, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [16, 4])
def test_decode(case, backend, block_size):
    check_decode(case, backend, block_size)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_batch(case, other, backend):
    check_mixed_batch(case, other, backend, block_size=4)
