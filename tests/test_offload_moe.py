"""--backend auto/cuda planning for a mixture-of-experts model (edged/offload.py): the MoE layers
stay on the host when the device backend lacks moe_combine (a hybrid split the summary names), the
output projection still goes to the device; with moe_combine everything does. The device is
tests/helpers/fake_device.py's stand-in, the probe a DeviceInfo with room for everything."""

import numpy as np
import pytest

import edged.backends.cpu as cpu
from edged.backends.cuda.probe import DeviceInfo
from edged.models import load_model
from edged.offload import apply, plan
from edged.quant import load_gguf
from tests.helpers.fake_device import DeviceArray, make_fake_device
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]
ROOMY = lambda: DeviceInfo(True, name="test", free_bytes=2**36, total_bytes=2**36)  # noqa: E731


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("q3moe") / "m.gguf", "qwen3moe", seed=4)


@pytest.fixture(scope="module")
def host_ids(path):
    return greedy(load_model(load_gguf(path)), PROMPT, 4).ids


def _with_moe_combine():
    dev = make_fake_device()

    def moe_combine(ys, src, w):
        return cpu.moe_combine([y.view(np.ndarray) for y in ys], src, w).view(DeviceArray)

    dev.moe_combine = moe_combine
    return dev


@pytest.mark.parametrize("backend, layers", [("auto", None), ("cuda", "99")])
def test_moe_layers_stay_on_the_host(path, host_ids, backend, layers):
    model = load_model(load_gguf(path))
    dev = make_fake_device()
    p = plan(model, backend, layers, kv_tokens=256, probe=ROOMY, device_ops=dev)
    assert (p.backend, p.gpu_layers, p.output_on_gpu) == ("cuda", 0, True)
    assert f"0/{model.n_layers} layers + output on the GPU" in p.describe()
    assert f"the {model.n_layers} mixture-of-experts layers stay on the CPU (the GPU backend has no moe_combine)" \
        in p.describe()
    apply(model, p, device_ops=dev)
    assert model.layer_ops == [cpu] * model.n_layers and model.output_ops is dev
    assert greedy(model, PROMPT, 4).ids == host_ids
    assert dev.uploads > 0  # the output projection really ran on the device


def test_device_with_moe_combine_takes_every_layer(path, host_ids):
    model = load_model(load_gguf(path))
    dev = _with_moe_combine()
    p = plan(model, "auto", kv_tokens=256, probe=ROOMY, device_ops=dev)
    assert (p.gpu_layers, p.output_on_gpu) == (model.n_layers, True) and "mixture" not in p.describe()
    apply(model, p, device_ops=dev)
    assert model.layer_ops == [dev] * model.n_layers
    assert greedy(model, PROMPT, 4).ids == host_ids
