"""Every architecture's tiny random model on a real device, wholly and split, through
edged.offload's plan/apply as `--backend cuda --gpu-layers N` uses them: the greedy tokens equal
the CPU backend's (the simulator runs two of these cases; a device runs them all in seconds)."""

import functools

import pytest

from edged.models import load_model
from edged.offload import apply, plan
from edged.quant import load_gguf
from tests.helpers.tiny_models import ARCHS, write_tiny_model
from tests.models.driver import greedy

PROMPT = [5, 17, 42, 9, 7, 33, 12, 60, 2, 41, 18]  # longer than the tiny sliding windows
N_NEW = 6


@functools.lru_cache(maxsize=None)
def _tiny(arch: str, tmp: str):
    small = {} if arch == "gpt-oss" else {"vocab": 64}  # gpt-oss's harmony tokens need its own vocabulary
    gf = load_gguf(write_tiny_model(f"{tmp}/{arch}.gguf", arch, seed=5, n_layers=2, **small))
    return gf, greedy(load_model(gf), PROMPT, N_NEW).ids


MOE = ("qwen3moe", "gpt-oss")  # their layers stay on the host (CUDA has no moe_combine): only the output moves
CASES = [(a, n) for a in ARCHS for n in ("1", "99") if not (a in MOE and n == "1")]


@pytest.mark.parametrize("arch,gpu_layers", CASES)
def test_tiny_model_on_the_device_gives_the_cpu_tokens(arch, gpu_layers, tmp_path_factory):
    gf, cpu_ids = _tiny(arch, str(tmp_path_factory.getbasetemp()))
    model = load_model(gf)
    p = plan(model, "cuda", gpu_layers, kv_tokens=64, batch_tokens=16)
    assert p.backend == "cuda" and (p.gpu_layers > 0 or p.output_on_gpu), p.describe()
    apply(model, p)
    assert greedy(model, PROMPT, N_NEW).ids == cpu_ids, p.describe()
