"""Tiny Gemma 3 (6 layers: 5 sliding-window + 1 global) against the float64 reference forward."""

import numpy as np
import pytest

from tests.helpers.tiny_models import write_tiny_model
from tests.models.tiny_checks import (BACKENDS, TinyCase, check_decode, check_mixed_batch,
                                      check_prefill)


@pytest.fixture(scope="module", params=[4, 0], ids=["window4", "no_window"])
def case(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("gemma3") / "m.gguf", "gemma3", sliding_window=request.param)
    return TinyCase(path)


@pytest.fixture(scope="module")
def other(case):
    return TinyCase(case.path, n_tokens=10, seed=7)


def test_window_matters(case, tmp_path):
    # the sequence (13 tokens) is longer than the window: local layers must see fewer keys
    model = case.model("numpy")
    assert [model.layer_window(i) for i in range(6)] == ([4] * 5 + [0] if model.hparams.sliding_window else [0] * 6)
    other = TinyCase(write_tiny_model(tmp_path / "w.gguf", "gemma3",
                                      sliding_window=0 if model.hparams.sliding_window else 4))
    assert np.abs(other.ref_logits[-1] - case.ref_logits[-1]).max() > 1e-3


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
