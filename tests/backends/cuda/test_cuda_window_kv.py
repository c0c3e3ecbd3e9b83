"""Sliding-window layers' own KV group on the CUDA backend (simulator): prepare_batch uploads the
window tables, attention through them (-1 before each window) equals the CPU's through the full
tables, and a hybrid engine that frees window blocks gives the CPU engine's greedy tokens."""

import numpy as np
import pytest

from edged.backends.cpu.attention import allocate_kv as cpu_allocate_kv
from edged.backends.cpu.attention import attention as cpu_attention
from edged.backends.cpu.attention import store_kv as cpu_store_kv
from tests.backends.cuda.checks import attention_case, ops

WINDOW = 6


def test_attention_through_window_tables_equals_full_tables():
    o = ops()
    rng = np.random.default_rng(11)
    bs, kvh, g, hd = 2, 1, 2, 16
    seqs = [(11, 3), (0, 1), (9, 1)]  # (context, new tokens): two reach past the window
    q, k, v, slots, batch, num_blocks = attention_case(rng, bs, kvh, g, hd, seqs)
    window_tables = batch.block_tables.copy()  # [n_seqs, max_blocks]
    for s, (c, _) in enumerate(seqs):  # blocks before the first new token's window are gone
        window_tables[s, : max(0, c - WINDOW + 1) // bs] = -1
    batch.window_block_tables = window_tables
    batch.window_slot_mapping = batch.slot_mapping.copy()
    assert (window_tables == -1).sum() > (batch.block_tables == -1).sum()
    scale = 1.0 / np.sqrt(hd)
    kv_cpu = cpu_allocate_kv(num_blocks, bs, kvh, hd)
    cpu_store_kv(kv_cpu, k, v, slots)
    want = cpu_attention(q, kv_cpu, batch, scale, WINDOW)  # [n, h, hd] through the full tables
    kv = o.allocate_kv(num_blocks, bs, kvh, hd)
    o.store_kv(kv, o.upload(k), o.upload(v), o.upload(slots))
    prepared = o.prepare_batch(batch)
    for name in ("window_block_tables", "window_slot_mapping"):
        assert not isinstance(getattr(prepared, name), np.ndarray), name
    view = prepared.window_view()
    assert view.block_tables is prepared.window_block_tables
    got = o.to_host(o.attention(o.upload(q), kv, view, scale, WINDOW))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


@pytest.mark.slow  # the simulator runs one layer of a 6-layer model for ~12 steps: minutes
def test_hybrid_engine_with_window_pool_gives_cpu_tokens(tmp_path):
    from edged.engine.engine import Engine, EngineConfig
    from edged.models import load_model
    from edged.offload import apply, plan
    from edged.quant import load_gguf
    from edged.sampling import SamplingParams
    from edged.tokenizer import Tokenizer
    from tests.helpers.tiny_models import write_tiny_model

    # 6 layers: 5 sliding (window 4), 1 global; layer 0 (sliding) on the device
    gf = load_gguf(write_tiny_model(tmp_path / "g.gguf", "gemma3", seed=5, vocab=64))
    tok = Tokenizer.from_gguf(gf)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = [5, 17, 42, 9, 7, 11, 30, 8, 19]  # 9 tokens + 6: well past the window
    cfg = dict(num_blocks=16, block_size=4, max_batch_tokens=16, max_seqs=1)

    def run(model, **extra):
        eng = Engine(model, tok, EngineConfig(**cfg, **extra)).start()
        try:
            return [d.token_id for d in eng.generate(prompt, params)], eng.window_pool is not None
        finally:
            eng.stop()

    cpu_ids, _ = run(load_model(gf), free_window_blocks=False)
    model = load_model(gf)
    apply(model, plan(model, "cuda", "1", kv_tokens=64, batch_tokens=16))
    assert run(model) == (cpu_ids, True)
