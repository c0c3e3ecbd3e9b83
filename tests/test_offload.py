"""Backend choice and --gpu-layers planning (edged/offload.py), with a stand-in device probe."""

import subprocess
import sys

import pytest

from edged.backends.cuda.probe import DeviceInfo
from edged.models import load_model
from edged.offload import SAFETY_MARGIN_BYTES, OffloadError, apply, parse_gpu_layers, plan, workspace_bytes
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(load_gguf(write_tiny_model(tmp_path_factory.mktemp("m") / "m.gguf", "llama")))


def _device(free):
    return lambda: DeviceInfo(True, name="test", free_bytes=free, total_bytes=free)


def _free_for(model, n_layers, kv_tokens, *, output=False, slack=1):
    per_kv = kv_tokens * model.kv_bytes_per_token() // model.n_layers
    need = sum(model.layer_bytes(i) + per_kv for i in range(n_layers))
    need += model.output_bytes() if output else 0
    return need + SAFETY_MARGIN_BYTES + workspace_bytes(model, 512) + slack


def test_parse_gpu_layers():
    assert parse_gpu_layers("auto") is None and parse_gpu_layers(None) is None
    assert parse_gpu_layers("12") == 12 and parse_gpu_layers(0) == 0
    for bad in ("-1", "many", "1.5"):
        with pytest.raises(ValueError, match="--gpu-layers"):
            parse_gpu_layers(bad)


def test_cpu_needs_no_probe(model):
    def probe():
        raise AssertionError("cpu must not probe for a device")
    p = plan(model, "cpu", "8", probe=probe)
    assert (p.backend, p.gpu_layers, p.output_on_gpu) == ("cpu", 0, False)


def test_auto_without_device_picks_cpu(model):
    p = plan(model, "auto", probe=lambda: DeviceInfo(False, "no NVIDIA driver"))
    assert p.backend == "cpu" and "no NVIDIA driver" in p.describe()


def test_auto_ignores_the_simulator(model):
    sim = lambda: DeviceInfo(True, name="sim", free_bytes=2**34, total_bytes=2**34, simulated=True)  # noqa: E731
    assert plan(model, "auto", probe=sim).backend == "cpu"
    assert plan(model, "cuda", probe=sim).backend == "cuda"


def test_cuda_without_device_is_a_clear_error(model):
    with pytest.raises(OffloadError, match="--backend cuda: no NVIDIA driver"):
        plan(model, "cuda", probe=lambda: DeviceInfo(False, "no NVIDIA driver"))


def test_auto_layers_fill_free_memory(model):
    for n in range(model.n_layers):
        p = plan(model, "cuda", "auto", kv_tokens=1024, probe=_device(_free_for(model, n, 1024)))
        assert (p.gpu_layers, p.output_on_gpu) == (n, False)
    every = _free_for(model, model.n_layers, 1024, output=True)
    p = plan(model, "cuda", "auto", kv_tokens=1024, probe=_device(every))
    assert (p.gpu_layers, p.output_on_gpu) == (model.n_layers, True)
    # all layers fit but the output projection does not: it stays on the CPU
    p = plan(model, "cuda", "auto", kv_tokens=1024, probe=_device(every - model.output_bytes()))
    assert (p.gpu_layers, p.output_on_gpu) == (model.n_layers, False)


def test_explicit_layers_that_do_not_fit_name_the_numbers(model):
    free = _free_for(model, 1, 1024)
    assert plan(model, "cuda", "1", kv_tokens=1024, probe=_device(free)).gpu_layers == 1
    with pytest.raises(OffloadError, match=r"--gpu-layers 2: 2 layers \+ output need [\d.]+ MiB .* only [\d.]+ MiB"):
        plan(model, "cuda", "2", kv_tokens=1024, probe=_device(free))


def test_sliding_layers_reserve_their_own_pool_size(tmp_path):
    g = load_model(load_gguf(write_tiny_model(tmp_path / "g.gguf", "gemma3")))  # 6 layers, 1 global
    sliding = [i for i in range(g.n_layers) if g.layer_window(i)]
    assert 0 < len(sliding) < g.n_layers
    per_token = g.kv_bytes_per_token() // g.n_layers
    need = sum(g.layer_bytes(i) + per_token * (64 if i in sliding else 4096) for i in range(g.n_layers))
    free = need + SAFETY_MARGIN_BYTES + workspace_bytes(g, 512)  # every layer fits, not the output
    p = plan(g, "cuda", "auto", kv_tokens=(4096, 64), probe=_device(free))
    assert (p.gpu_layers, p.output_on_gpu) == (g.n_layers, False)
    assert "sliding layers: 64" in p.describe()
    # counted as one pool of 4096 tokens for every layer, the same memory holds fewer layers
    assert plan(g, "cuda", "auto", kv_tokens=4096, probe=_device(free)).gpu_layers < g.n_layers


def test_more_layers_than_the_model_has_means_all_and_output(model):
    p = plan(model, "cuda", "99", kv_tokens=64, probe=_device(2**40))
    assert (p.gpu_layers, p.output_on_gpu) == (model.n_layers, True)


def test_cpu_only_run_never_imports_cuda_modules(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "llama")
    code = ("import sys; from edged.loader import load; "
            f"lm = load({str(path)!r}, warmup=False, quiet=True, backend='auto'); "
            "bad = [m for m in sys.modules if m.startswith('numba.cuda') or m.startswith('numba_cuda') "
            "or m.startswith('edged.backends.cuda.') and m != 'edged.backends.cuda.probe']; "
            "print(lm.placement.backend, bad)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cpu []"


def test_layers_with_a_type_the_device_lacks_stay_on_the_host(tmp_path):
    """Layer 1's ffn_down is Q4_K (layer 0's Q6_K): a device without Q4_K takes layer 0 and the
    F16 output; the host runs layer 1, and placing checks each backend only on its own weights."""
    from gguf import GGMLQuantizationType as T

    from tests.helpers.fake_device import make_fake_device
    from tests.models.driver import greedy

    path = write_tiny_model(tmp_path / "m.gguf", "llama")
    want = greedy(load_model(load_gguf(path)), [5, 17, 42, 9], 3).ids
    model = load_model(load_gguf(path))
    dev = make_fake_device(unsupported={T.Q4_K})
    p = plan(model, "cuda", "99", kv_tokens=64, probe=_device(2**40), device_ops=dev)
    assert (p.gpu_layers, p.output_on_gpu) == (1, True)
    assert "layers 1 and after stay on the CPU (tensor 'blk.1.ffn_down.weight'" in p.describe()
    apply(model, p, device_ops=dev)
    assert model.layer_ops[0] is dev and model.output_ops is dev
    assert greedy(model, [5, 17, 42, 9], 3).ids == want


def test_output_of_a_type_the_device_lacks_stays_on_the_host(model):
    from gguf import GGMLQuantizationType as T

    from tests.helpers.fake_device import make_fake_device

    p = plan(model, "cuda", "99", kv_tokens=64, probe=_device(2**40), device_ops=make_fake_device(unsupported={T.F16}))
    # F16 is also layer 0's ffn_gate: nothing goes to the device
    assert (p.gpu_layers, p.output_on_gpu) == (0, False)
    assert "the output projection stays on the CPU" in p.describe()


def test_cuda_type_table_needs_no_numba_cuda():
    """The planner asks the CUDA backend's type table before choosing the device: it must not load numba.cuda."""
    code = ("import sys; from edged.backends.cuda import types; types.check_supported(8); "
            "print(any(m.startswith(('numba.cuda', 'numba_cuda')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
