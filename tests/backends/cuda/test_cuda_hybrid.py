"""Hybrid CPU/GPU placement with the real CUDA backend (simulated): the greedy tokens of every split
of a tiny model equal the CPU backend's, through edged.offload's plan/apply as `--backend cuda
--gpu-layers N` uses them."""

import functools

import pytest

from edged.models import load_model
from edged.offload import apply, plan
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy

PROMPT = [5, 17, 42, 9, 7]  # longer than gemma3's tiny window (4): the window is exercised
N_NEW = 2


@functools.lru_cache(maxsize=None)
def _tiny(arch: str, tmp: str):
    # two layers and a 64-token vocabulary keep the simulator quick; gemma3's are sliding-window layers
    gf = load_gguf(write_tiny_model(f"{tmp}/{arch}.gguf", arch, seed=5, n_layers=2, vocab=64))
    return gf, greedy(load_model(gf), PROMPT, N_NEW).ids


# the simulator runs every CUDA thread as a Python thread (1.3-4.5 min a case on 2 cores, with the
# conftest's GIL switch interval; the more in a fresh clone's first compiles): the default suite runs llama with 1 of 2 layers on the GPU and
# gemma3 wholly on it; -m slow adds the others
@pytest.mark.parametrize("arch,gpu_layers", [
    ("llama", "1"), ("gemma3", "all"),
    pytest.param("llama", "all", marks=pytest.mark.slow), pytest.param("gemma3", "1", marks=pytest.mark.slow),
])
@pytest.mark.timeout(1800)  # minutes of simulator time on 2 cores; the 600 s default is for the rest
def test_split_gives_the_cpu_tokens(arch, gpu_layers, tmp_path_factory):
    gf, cpu_ids = _tiny(arch, str(tmp_path_factory.getbasetemp()))
    model = load_model(gf)
    p = plan(model, "cuda", "99" if gpu_layers == "all" else gpu_layers, kv_tokens=64, batch_tokens=16)
    assert p.backend == "cuda" and p.gpu_layers == (2 if gpu_layers == "all" else 1)
    assert p.output_on_gpu == (gpu_layers == "all")
    apply(model, p)
    assert type(model.allocate_kv(2, 16)[0].k).__module__ != "numpy"  # layer 0's KV is on the device
    assert greedy(model, PROMPT, N_NEW).ids == cpu_ids
