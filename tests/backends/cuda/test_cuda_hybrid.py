"""Hybrid CPU/GPU placement with the real CUDA backend (simulated): the greedy tokens of every split
of a tiny model equal the CPU backend's, through edged.offload's plan/apply as `--backend cuda
--gpu-layers N` uses them."""

import pytest

from edged.models import load_model
from edged.offload import apply, plan
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy

PROMPT = [5, 17, 42, 9, 7]  # longer than gemma3's tiny window (4): the window is exercised
N_NEW = 2


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    # two layers and a 64-token vocabulary keep the simulator quick; gemma3's are sliding-window layers
    path = write_tiny_model(tmp_path_factory.mktemp("m") / "m.gguf", request.param, seed=5, n_layers=2,
                            vocab=64)
    gf = load_gguf(path)
    return gf, greedy(load_model(gf), PROMPT, N_NEW).ids


# the simulator runs every CUDA thread as a Python thread: ~1-3 min per case on 2 cores
@pytest.mark.parametrize("gpu_layers", ["1", "all"])
def test_split_gives_the_cpu_tokens(tiny, gpu_layers):
    gf, cpu_ids = tiny
    model = load_model(gf)
    p = plan(model, "cuda", "99" if gpu_layers == "all" else gpu_layers, kv_tokens=64, batch_tokens=16)
    assert p.backend == "cuda" and p.gpu_layers == (2 if gpu_layers == "all" else 1)
    assert p.output_on_gpu == (gpu_layers == "all")
    apply(model, p)
    assert type(model.allocate_kv(2, 16)[0].k).__module__ != "numpy"  # layer 0's KV is on the device
    assert greedy(model, PROMPT, N_NEW).ids == cpu_ids
