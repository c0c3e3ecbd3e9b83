"""The CUDA op set behind models/decoder.py's placement (simulator, tiny models): layers on the
CUDA backend give the host's greedy tokens, and top-5 log-probabilities within float rounding."""

import numpy as np
import pytest

import edged.backends.cpu as cpu
from edged.models import load_model
from edged.quant import load_gguf
from tests.backends.cuda.checks import ops
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


@pytest.mark.slow  # minutes under the simulator: every CUDA thread is a Python thread
@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_first_layer_on_cuda_gives_the_host_tokens(arch, tmp_path):
    gf = load_gguf(write_tiny_model(tmp_path / "m.gguf", arch, seed=4))
    ref = greedy(load_model(gf), PROMPT, 3)
    model = load_model(gf)
    cuda_ops = ops()
    model.place([cuda_ops] + [cpu] * (model.n_layers - 1), cpu)
    got = greedy(model, PROMPT, 3)  # prefill (mat-vec, 8 tokens) + 2 decode steps
    assert got.ids == ref.ids
    for a, b in zip(got.steps, ref.steps):
        assert [i for i, _ in a] == [i for i, _ in b]
        np.testing.assert_allclose([p for _, p in a], [p for _, p in b], atol=1e-4)
