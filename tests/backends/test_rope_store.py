"""rope_store_kv, the CPU's fused q/k norm + RoPE + KV store, against its definition: the ops one
after another (base.rope_store_kv_by_ops), bit for bit, for every KV type, with and without norms,
at decode sizes (one serial call) and prefill sizes (the thread-pool ops)."""

import numpy as np
import pytest

from edged.backends import cpu
from edged.backends.base import KV_TYPES, RopeParams, rope_store_kv_by_ops

NH, KVH, HD = 4, 2, 64


def _case(n, seed, blocks=12):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, h, HD)).astype(np.float32) * 3 for h in (NH, KVH, KVH))
    positions = rng.integers(0, 4000, n).astype(np.int32)
    slots = rng.permutation(blocks * 16)[:n].astype(np.int32)
    slots[0] = -1  # a padding token: stored nowhere
    return q, k, v, positions, slots


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("norms", [False, True])
# 100 x 4 x 64 is past SERIAL_ELEMENTS: the thread-pool path; 700 x 24 pairs also computes the step's
# (cos, sin) table there
@pytest.mark.parametrize("n", [1, 3, 100, 700])
def test_fused_equals_the_ops_one_by_one(kv_type, norms, n):
    q, k, v, positions, slots = _case(n, seed=n, blocks=64)
    p = RopeParams(dim=48, freq_base=10000.0, neox=not norms)  # dim < head_dim: the tail is copied
    qn = np.linspace(0.5, 1.5, HD, dtype=np.float32) if norms else None
    kn = np.linspace(1.5, 0.5, HD, dtype=np.float32) if norms else None
    fused_kv, ops_kv = (cpu.allocate_kv(64, 16, KVH, HD, kv_type) for _ in range(2))
    got = cpu.rope_store_kv(q, k, v, fused_kv, positions, slots, p, 1e-6, qn, kn)
    want = rope_store_kv_by_ops(cpu, q, k, v, ops_kv, positions, slots, p, 1e-6, qn, kn)
    assert np.array_equal(got, want)
    for a, b in ((fused_kv.k, ops_kv.k), (fused_kv.v, ops_kv.v), (fused_kv.k_scale, ops_kv.k_scale)):
        if a is not None:
            assert np.array_equal(a, b)
    assert not np.array_equal(got, q)  # it did rotate


def test_bad_inputs_are_errors_before_any_write():
    q, k, v, positions, slots = _case(2, seed=9)
    kv = cpu.allocate_kv(12, 16, KVH, HD, "f16")
    p = RopeParams(dim=64, freq_base=10000.0, neox=True)
    before = kv.k.copy()
    with pytest.raises(ValueError, match="slot out of range"):
        cpu.rope_store_kv(q, k, v, kv, positions, np.array([5, 10_000], np.int32), p, 1e-6)
    with pytest.raises(ValueError, match="do not fit"):
        cpu.rope_store_kv(q, k[:, :1], v[:, :1], kv, positions, slots, p, 1e-6)
    with pytest.raises(ValueError, match="must be \\(2,\\)"):
        cpu.rope_store_kv(q, k, v, kv, positions[:1], slots, p, 1e-6)
    with pytest.raises(ValueError, match="both be None or both"):
        cpu.rope_store_kv(q, k, v, kv, positions, slots, p, 1e-6, np.ones(HD, np.float32), None)
    assert np.array_equal(kv.k[1:], before[1:])  # block 0 holds slot 5: only it may have been written


def test_one_rope_table_per_step_follows_positions_and_params():
    """The decode path keeps one (cos, sin) table per RopeParams for the step's positions (every
    layer asks for it): new positions, positions rewritten in place, or a changed parameter each
    give the ops' bits again, never a stale table."""
    p = RopeParams(dim=64, freq_base=10000.0, neox=True)

    def both(q, k, v, positions, slots):
        fused_kv, ops_kv = (cpu.allocate_kv(12, 16, KVH, HD, "f32") for _ in range(2))
        got = cpu.rope_store_kv(q, k, v, fused_kv, positions, slots, p, 1e-6)
        return got, rope_store_kv_by_ops(cpu, q, k, v, ops_kv, positions, slots, p, 1e-6)

    q, k, v, positions, slots = _case(3, seed=4)
    first = both(q, k, v, positions, slots)
    assert np.array_equal(*first) and "_step_cs" in p.__dict__
    assert np.array_equal(*both(q, k, v, positions, slots))  # a later layer: the kept table
    positions += 7  # the same array, new contents
    moved = both(q, k, v, positions, slots)
    assert np.array_equal(*moved) and not np.array_equal(moved[0], first[0])
    p.freq_base = 500000.0
    rebased = both(q, k, v, positions, slots)
    assert np.array_equal(*rebased) and not np.array_equal(rebased[0], moved[0])
    last = rebased[0]
    for field, value in (("freq_scale", 0.5), ("freq_factors", np.linspace(1.0, 4.0, 32, dtype=np.float32)),
                         ("attn_factor", 2.0), ("freq_factors", None), ("dim", 32)):
        setattr(p, field, value)  # each a field the kept table is keyed by
        got = both(q, k, v, positions, slots)
        assert np.array_equal(*got) and not np.array_equal(got[0], last), field
        last = got[0]
