"""Tiny Qwen3 (per-head q/k RMS norms, head_dim 32 ≠ n_embd / n_heads) against the float64 reference forward."""

import pytest

from tests.helpers.tiny_models import write_tiny_model
from tests.models.tiny_checks import (BACKENDS, TinyCase, check_decode, check_mixed_batch,
                                      check_prefill)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return TinyCase(write_tiny_model(tmp_path_factory.mktemp("qwen3") / "m.gguf", "qwen3"))


@pytest.fixture(scope="module")
def other(case):
    return TinyCase(case.path, n_tokens=10, seed=7)


def test_loaded(case):
    model = case.model("numpy")
    a = model.layers[1].attn
    assert model.head_dim == 32 and a.wq.shape == (128, 64) and a.q_norm.shape == (32,)
    assert model.layers[0].rope.neox and model.output is not model.token_embd


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
