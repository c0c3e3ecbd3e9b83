"""The decoder runs a decode step's layers in one CPU call (cpu.layers_step) where every layer is a
dense one the one-call layer step takes whole, with the per-layer path's bits: greedy tokens and
top-5 logprobs, the K/V it stores (sliding-window layers in their own caches too), and the errors
it raises; MoE stacks and layers the step does not take run layer by layer."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.backends.base import Batch
from edged.models import load_model
from edged.quant import load_gguf
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import greedy

DENSE = [("llama", T.Q4_K), ("qwen3", T.Q4_K), ("gemma2", T.Q4_K), ("gemma3", T.Q5_0), ("llama", T.Q8_0)]


def _model(tmp_path, arch, matrix_type, **extra):
    moe = dict(expert_type=T.Q4_K) if arch == "qwen3moe" else {}
    gf = load_gguf(write_tiny_model(tmp_path / "m.gguf", arch, seed=4, n_embd=256, n_heads=4, n_kv_heads=2,
                                    head_dim=64, matrix_type=matrix_type, **moe, **extra))
    return load_model(gf)


def _counting(monkeypatch):
    runs = []
    real = cpu.layers_step

    def step(x, *args):
        out = real(x, *args)
        runs.append((x.shape[0], out is not None))
        return out

    monkeypatch.setattr(cpu, "layers_step", step)
    return runs


@pytest.mark.parametrize("arch, matrix_type", DENSE + [("qwen3moe", T.Q4_K), ("gpt-oss", T.Q4_K)])
def test_decode_runs_the_stack_in_one_call_with_the_per_layer_bits(tmp_path, monkeypatch, arch, matrix_type):
    runs = _counting(monkeypatch)
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    stacked = greedy(_model(tmp_path, arch, matrix_type), prompt, 6)
    dense = (arch, matrix_type) in DENSE
    assert ((1, True) in runs) == dense and not any(ok for n, ok in runs if n > 1)  # decode only, dense only
    monkeypatch.delattr(cpu, "layers_step")
    layered = greedy(_model(tmp_path, arch, matrix_type), prompt, 6)
    assert stacked.ids == layered.ids and stacked.steps == layered.steps


def _decode_batch(positions, slots, tables, window_slots, window_tables, bs):
    n = len(positions)
    i32 = lambda a: np.asarray(a, np.int32)  # noqa: E731
    return Batch(token_ids=i32([3 + 5 * i for i in range(n)]), positions=i32(positions), seq_starts=i32(range(n + 1)),
                 seq_lens=i32(positions) + 1, block_tables=i32(tables), slot_mapping=i32(slots),
                 logits_indices=i32(range(n)), block_size=bs, window_block_tables=i32(window_tables),
                 window_slot_mapping=i32(window_slots))


def _prefilled(model, bs, blocks, window_blocks, tables, window_tables, lengths):
    """Caches with the window layers apart, holding each sequence's first `lengths` tokens."""
    kv = model.allocate_kv(blocks, bs, window_num_blocks=window_blocks)
    for s, n in enumerate(lengths):
        pos = np.arange(n)
        slots = np.asarray(tables[s])[pos // bs] * bs + pos % bs
        wslots = np.asarray(window_tables[s])[pos // bs] * bs + pos % bs
        b = Batch(token_ids=(pos * 7 + s) % 200 + 1, positions=pos.astype(np.int32),
                  seq_starts=np.array([0, n], np.int32), seq_lens=np.array([n], np.int32),
                  block_tables=np.asarray(tables[s : s + 1], np.int32), slot_mapping=slots.astype(np.int32),
                  logits_indices=np.array([n - 1], np.int32), block_size=bs,
                  window_block_tables=np.asarray(window_tables[s : s + 1], np.int32),
                  window_slot_mapping=wslots.astype(np.int32))
        model.forward(b, kv)
    return kv


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_window_layers_read_and_write_their_own_caches(tmp_path, monkeypatch, kv_type):
    """gemma3 with a window of 8 and the window layers' KV in a cache of their own (other block
    ids): two sequences' decode step through the stack stores and reads each layer's K/V where the
    per-layer path does, and gives its logits bit for bit."""
    model = _model(tmp_path, "gemma3", T.Q5_0, sliding_window=8)
    model.kv_type = kv_type
    bs, lengths = 4, (13, 6)
    tables, window_tables = [[0, 1, 2, 3], [4, 5, 6, 7]], [[9, 8, 7, 6], [1, 3, 5, 0]]
    b = _decode_batch(list(lengths), [tables[s][n // bs] * bs + n % bs for s, n in enumerate(lengths)], tables,
                      [window_tables[s][n // bs] * bs + n % bs for s, n in enumerate(lengths)], window_tables, bs)
    runs = _counting(monkeypatch)
    kv1 = _prefilled(model, bs, 8, 10, tables, window_tables, lengths)
    out1 = model.forward(b, kv1)
    assert runs[-1] == (2, True)
    monkeypatch.delattr(cpu, "layers_step")
    kv2 = _prefilled(model, bs, 8, 10, tables, window_tables, lengths)
    out2 = model.forward(b, kv2)
    np.testing.assert_array_equal(out1, out2)
    assert {c.k.shape[0] for c in kv1} == {8, 10}  # both kinds of layer ran
    for c1, c2 in zip(kv1, kv2):
        np.testing.assert_array_equal(c1.k, c2.k)
        np.testing.assert_array_equal(c1.v, c2.v)


def test_a_bad_slot_raises_as_the_per_layer_path_does(tmp_path, monkeypatch):
    model = _model(tmp_path, "llama", T.Q4_K)
    bs = 4
    kv = model.allocate_kv(4, bs)
    b = _decode_batch([0], [4 * bs + 1], [[0]], [4 * bs + 1], [[0]], bs)
    errors = []
    for drop in (False, True):
        if drop:
            monkeypatch.delattr(cpu, "layers_step")
        with pytest.raises(ValueError) as e:
            model.forward(b, kv)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "slot out of range" in errors[0]


def test_new_caches_replace_the_kept_plans(tmp_path):
    """The stack's kept per-layer rows hold their K/V arrays: caches allocated anew (a new engine
    on the same model) replace every kept plan, so the old caches are not held alive."""
    model = _model(tmp_path, "llama", T.Q4_K)
    bs = 4
    wo = model._step_args[0][2]
    for kv in (model.allocate_kv(4, bs), model.allocate_kv(6, bs)):
        for n in (1, 2):  # two batch sizes' plans
            b = _decode_batch([0] * n, [i * bs for i in range(n)], [[i] for i in range(n)], [i * bs for i in range(n)],
                              [[i] for i in range(n)], bs)
            model.forward(b, kv)
        kept = wo.__dict__["_layers_step"]
        assert kept[1][1] is kv and sorted(kept[2]) == [1, 2] and all(p is not None for p in kept[2].values())
