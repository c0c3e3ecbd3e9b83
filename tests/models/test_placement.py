"""Hybrid placement (models/decoder.py place()): any split of layers between the host and another
backend gives the host's greedy tokens bit for bit, activations cross each boundary once per step,
and the other backend never receives a host array. The "device" is tests/helpers/fake_device.py
(the CPU kernels behind a wall); the CUDA backend runs the same checks in tests/backends/cuda."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.models import load_model
from edged.models.errors import ModelError
from edged.quant import load_gguf
from tests.helpers.fake_device import make_fake_device
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


@pytest.fixture(scope="module", params=["gemma3", "llama", "phi3", "qwen2"])
def tiny(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("m") / "m.gguf", request.param, seed=4)
    return load_gguf(path)


def _split(model, dev, n_dev: int):
    n = model.n_layers
    model.place([dev if i < n_dev else cpu for i in range(n)], dev if n_dev >= n else cpu)


def test_every_split_gives_the_host_tokens(tiny):
    ref = greedy(load_model(tiny), PROMPT, 6)
    for n_dev in range(0, load_model(tiny).n_layers + 1):
        model, dev = load_model(tiny), make_fake_device()
        _split(model, dev, n_dev)
        got = greedy(model, PROMPT, 6)
        assert got.ids == ref.ids, f"{n_dev} device layers"
        assert got.steps == ref.steps


def test_one_crossing_per_boundary_per_step(tiny):
    model, dev = load_model(tiny), make_fake_device()
    _split(model, dev, 1)  # host embed -> device layer 0 -> host layers 1.. and output
    dev.uploads = dev.downloads = dev.batches = 0
    greedy(model, PROMPT, 3)  # 1 prefill + 2 decode steps
    assert (dev.uploads, dev.downloads, dev.batches) == (3, 3, 3)

    model, dev = load_model(tiny), make_fake_device()
    _split(model, dev, model.n_layers)  # everything on the device: only the logits come back
    dev.uploads = dev.downloads = 0
    greedy(model, PROMPT, 3)
    assert (dev.uploads, dev.downloads) == (3, 3)


def test_kv_lives_with_its_layer(tiny):
    model, dev = load_model(tiny), make_fake_device()
    _split(model, dev, 1)
    kv = model.allocate_kv(4, 16)
    assert type(kv[0].k).__name__ == "DeviceArray"
    assert all(type(c.k) is np.ndarray for c in kv[1:])


def test_host_weights_stay_untouched(tiny):
    model, dev = load_model(tiny), make_fake_device()
    before = model.layers[0]
    _split(model, dev, model.n_layers)
    assert model.layers[0] is before and type(model.layers[0].attn_norm) is np.ndarray


def test_unsupported_type_is_a_load_time_error(tiny):
    model = load_model(tiny)
    dev = make_fake_device(unsupported=(T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.F32, T.F16))
    with pytest.raises(ModelError, match="fake device has no kernel"):
        _split(model, dev, 1)


def test_placement_must_name_every_layer(tiny):
    model = load_model(tiny)
    with pytest.raises(ModelError, match="placement names"):
        model.place([cpu], cpu)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v biases added after the one matmul
def test_same_typed_projections_run_as_one_matrix_with_the_same_bits(arch, tmp_path, monkeypatch):
    """Every matrix Q8_0 (a grouped type: the host copies it at upload anyway): q|k|v and gate|up
    are placed as one matrix each, and the tokens and logprobs equal the separate matrices' bit for bit."""
    gf = load_gguf(write_tiny_model(tmp_path / "m.gguf", arch, seed=4, matrix_type=T.Q8_0))
    fused = load_model(gf)
    assert all(lw.attn.wqkv is not None and lw.ffn.gate is None for lw in fused._run_layers)
    assert fused._run_layers[0].attn.wqkv.name == "blk.0.attn_qkv.weight"
    monkeypatch.setattr(cpu, "fuses_rows", lambda qtype: False)
    apart = load_model(gf)
    assert all(lw.attn.wqkv is None and lw.ffn.gate is not None for lw in apart._run_layers)
    a, b = greedy(fused, PROMPT, 6), greedy(apart, PROMPT, 6)
    assert a.ids == b.ids and a.steps == b.steps


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_q_and_k_run_as_one_matrix_where_v_differs(arch, tmp_path, monkeypatch):
    """The tiny model's even layers have q, k Q5_0 and v Q8_0 (odd ones k Q4_0): there q|k is
    placed as one matrix beside v, elsewhere all stay apart, with the separate matrices' bits."""
    gf = load_gguf(write_tiny_model(tmp_path / "m.gguf", arch, seed=5))
    fused = load_model(gf)
    for i, lw in enumerate(fused._run_layers):
        a = lw.attn
        assert (a.wqk is not None) == (i % 2 == 0) and a.wqkv is None, i
        if a.wqk is not None:
            assert a.wq is None and a.wk is None and a.wv.qtype == T.Q8_0
            hp = fused.hparams
            assert a.wqk.name == f"blk.{i}.attn_qk.weight" and a.wqk.shape[0] == (hp.n_heads + hp.n_kv_heads) * hp.head_dim
    monkeypatch.setattr(cpu, "fuses_rows", lambda qtype: False)
    apart = load_model(gf)
    assert all(lw.attn.wqk is None and lw.attn.wq is not None for lw in apart._run_layers)
    a, b = greedy(fused, PROMPT, 6), greedy(apart, PROMPT, 6)
    assert a.ids == b.ids and a.steps == b.steps
