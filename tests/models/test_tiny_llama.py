"""Tiny Llama variants (plain, linear RoPE scaling with tied output, Llama 3 rope_freqs, mistral
alias) against the float64 reference forward."""

import pytest

from tests.helpers.tiny_models import write_tiny_model
from tests.models.tiny_checks import (BACKENDS, TinyCase, check_decode, check_mixed_batch,
                                      check_prefill)

VARIANTS = {
    "plain": dict(),
    "linear_tied": dict(rope_scaling="linear", tied=True),
    "rope_freqs": dict(rope_freqs=True),
    "mistral": dict(arch_name="mistral"),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def case(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("llama") / "m.gguf", "llama", **VARIANTS[request.param])
    return TinyCase(path)


@pytest.fixture(scope="module")
def other(case):
    return TinyCase(case.path, n_tokens=10, seed=7)


def test_variant_loaded(case):
    model = case.model("numpy")
    rope = model.layers[0].rope
    assert not rope.neox and model.n_layers == 2
    if case.gf.architecture == "llama" and "rope_freqs.weight" in case.gf.tensors:
        assert rope.freq_factors is not None and rope.freq_factors.shape == (8,)
    if model.hparams.rope_scaling == "linear":
        assert rope.freq_scale == 0.5 and model.output is model.token_embd


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
