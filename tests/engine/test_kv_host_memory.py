"""The KV pools are resident from allocation, so the engine refuses pools larger than the RAM the
OS has available, with the figures and the flags to change, before allocating anything."""

import pytest

import edged.engine.engine as engine_mod
from edged.engine.engine import Engine, EngineConfig
from tests.engine.engine_helpers import load_tiny


@pytest.fixture(scope="module", params=["llama", "gemma3"])  # one KV group; a second, sliding-window one
def tiny(request, tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("m"), request.param)


def test_host_bytes_are_what_allocate_kv_takes(tiny):
    model, _ = tiny
    windowed = any(lw.window for lw in model.layers)
    kv = model.allocate_kv(40, 4, window_num_blocks=12 if windowed else None)
    held = sum(a.nbytes for layer in kv for a in (layer.k, layer.v, layer.k_scale, layer.v_scale) if a is not None)
    assert model.kv_host_bytes(40, 4, 12 if windowed else None) == held


def test_a_pool_larger_than_available_ram_is_refused(tiny, monkeypatch):
    model, tok = tiny
    config = EngineConfig(num_blocks=4096, block_size=16, max_batch_tokens=64, max_seqs=4)
    monkeypatch.setattr(engine_mod, "available_memory", lambda: 2**20)  # 1 MiB free
    with pytest.raises(ValueError, match=r"the KV cache needs [\d,]+ MiB of RAM and 1 MiB are available: "
                                         r"lower --ctx or --max-seqs, or set --kv-memory"):
        Engine(model, tok, config)
    monkeypatch.setattr(engine_mod, "available_memory", lambda: 2**40)
    Engine(model, tok, config).start().stop()
