"""Tiny Llama variants (plain, linear RoPE scaling with tied output, Llama 3 rope_freqs, mistral
alias) against the float64 reference forward."""

import numpy as np
import pytest

from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import Seq, ShuffledBlocks, make_batch
from tests.models.tiny_checks import (BACKENDS, TinyCase, check_decode, check_mixed_batch,
                                      check_prefill, rel_err)

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


def test_chunk_without_logit_rows(case):
    """A prefill chunk that needs no logits still stores its KV; the next chunk sees it."""
    model = case.model("numpy")
    kv, alloc, seq = model.allocate_kv(6, 4), ShuffledBlocks(6), Seq()
    first = make_batch([seq], [case.tokens[:6]], alloc, 4)
    first.logits_indices = np.zeros(0, np.int32)
    assert model.forward(first, kv).shape == (0, model.vocab_size)
    rest = model.forward(make_batch([seq], [case.tokens[6:]], alloc, 4), kv)
    assert rel_err(rest[0], case.ref_logits[-1]) <= 1e-4
