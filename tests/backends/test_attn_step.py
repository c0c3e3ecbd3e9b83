"""cpu.attention_block_step (a decode step's attention block in one call) against the ops it stands
for, one after another, bit for bit: fused q|k|v, q|k beside v and separate projections; every KV
type; q/k norms, biases, sinks, a window, a soft-cap and a post-attention norm; one token, and
tokens of several sequences (one with more keys than an attention chunk); a MoE or dense layer's
FFN and residual add in the same call. None where it does not apply, with nothing written; bad
slots and block tables raise as the ops raise.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import edged.backends.cpu as cpu
from edged.backends.base import KV_TYPES, Batch, RopeParams
from edged.quant.tensor import QTensor
from tests.helpers.qdata import random_qtensor

D, NH, KVH, HD, BS, BLOCKS = 256, 4, 2, 64, 16, 64
EPS, SCALE = 1e-6, 0.125
ROPE = RopeParams(dim=64, freq_base=10000.0, neox=True)


# q, k, v, wo types per layout: K-quants; and the 32-element block types (Gemma 3's Q4_K_M file:
# q|k Q5_0 beside a Q8_0 v, wo Q4_K), grouped by the backend's copy or raw
_TYPES = {"qkv": (T.Q4_K, T.Q4_K, T.Q4_K, T.Q4_K), "qk_v": (T.Q4_K, T.Q4_K, T.Q6_K, T.Q4_K),
          "q_k_v": (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS), "legacy_qk_v": (T.Q5_0, T.Q5_0, T.Q8_0, T.Q4_K),
          "legacy_q_k_v": (T.Q4_0, T.Q5_1, T.IQ4_NL, T.Q8_0)}


def _mats(layout: str):
    """(q|k|v matrices, wo) as the CPU backend holds them (its copies; the q_k_v layouts raw)."""
    tq, tk, tv, to = _TYPES[layout]
    q, k, v = (random_qtensor(t, r, D, seed=s, name=n) for t, r, s, n in
               ((tq, NH * HD, 1, "q"), (tk, KVH * HD, 2, "k"), (tv, KVH * HD, 3, "v")))
    cat = lambda ws, name: QTensor(name, ws[0].qtype, (sum(w.shape[0] for w in ws), D),  # noqa: E731
                                   np.concatenate([w.rows().reshape(-1) for w in ws]))
    if layout == "qkv":
        mats = (cat((q, k, v), "qkv"),)
    elif layout.endswith("qk_v"):
        mats = (cat((q, k), "qk"), v)
    else:
        mats = (q, k, v)  # GGUF's own rows (no copy)
    wo = random_qtensor(to, D, NH * HD, seed=4, name="wo")
    up = (lambda w: w) if layout.endswith("q_k_v") else cpu.upload_matrix
    return tuple(up(w) for w in mats), up(wo)


def _batch(positions):
    """One token of each of len(positions) sequences, sequence s at positions[s] (its keys before
    it already stored), each in its own run of blocks."""
    n = len(positions)
    per = BLOCKS // n
    tables = np.arange(n * per, dtype=np.int32).reshape(n, per)
    pos = np.asarray(positions, np.int32)
    slots = np.array([tables[s, p // BS] * BS + p % BS for s, p in enumerate(pos)], np.int32)
    return Batch(token_ids=np.zeros(n, np.int32), positions=pos, seq_starts=np.arange(n + 1, dtype=np.int32),
                 seq_lens=pos + 1, block_tables=tables, slot_mapping=slots, logits_indices=np.arange(n, dtype=np.int32),
                 block_size=BS)


def _filled_kv(kv_type, seed):
    kv = cpu.allocate_kv(BLOCKS, BS, KVH, HD, kv_type)
    rng = np.random.default_rng(seed)
    k, v = (rng.standard_normal((BLOCKS * BS, KVH, HD)).astype(np.float32) for _ in range(2))
    cpu.store_kv(kv, k, v, np.arange(BLOCKS * BS, dtype=np.int32))
    return kv


def _vectors(seed, extras):
    rng = np.random.default_rng(seed)
    vec = lambda m, lo=0.5, hi=1.5: rng.uniform(lo, hi, m).astype(np.float32)  # noqa: E731
    o = dict(attn_norm=vec(D), ffn_norm=vec(D), q_norm=None, k_norm=None, bqkv=None, bo=None, sinks=None,
             post_norm=None, window=0, softcap=0.0)
    if "norms" in extras:
        o.update(q_norm=vec(HD), k_norm=vec(HD))
    if "biases" in extras:
        o.update(bqkv=(vec(NH * HD, -1, 1), vec(KVH * HD, -1, 1), vec(KVH * HD, -1, 1)), bo=vec(D, -1, 1))
    if "sinks" in extras:
        o.update(sinks=vec(NH, -2, 2))
    if "window" in extras:
        o.update(window=40, softcap=3.0)
    if "post_norm" in extras:
        o.update(post_norm=vec(D))
    return o


def _ops(x, mats, wo, kv, batch, o):
    """The general path: what models/decoder.py runs without the step."""
    n = x.shape[0]
    h = cpu.rms_norm(x, o["attn_norm"], EPS)
    qkv = np.concatenate(cpu.matmuls(mats, h), axis=1)
    q, k, v = qkv[:, : NH * HD], qkv[:, NH * HD : (NH + KVH) * HD], qkv[:, (NH + KVH) * HD :]
    if o["bqkv"] is not None:
        q, k, v = (cpu.add(a, b) for a, b in zip((q, k, v), o["bqkv"]))
    q = cpu.rope_store_kv(q.reshape(n, NH, HD), k.reshape(n, KVH, HD), v.reshape(n, KVH, HD), kv, batch.positions,
                          batch.slot_mapping, ROPE, EPS, o["q_norm"], o["k_norm"])
    a = cpu.attention(q, kv, batch, SCALE, o["window"], o["softcap"], sinks=o["sinks"])
    y = cpu.matmul(wo, a.reshape(n, NH * HD))
    if o["bo"] is not None:
        y = cpu.add(y, o["bo"], out=y)
    if o["post_norm"] is not None:
        y = cpu.rms_norm(y, o["post_norm"], EPS)
    x = cpu.add(x, y, out=x)
    return x, cpu.rms_norm(x, o["ffn_norm"], EPS)


def _step(x, mats, wo, kv, batch, o):
    return cpu.attention_block_step(x, o["attn_norm"], mats, wo, o["ffn_norm"], kv, batch, ROPE, EPS, SCALE,
                                    o["window"], o["softcap"], o["q_norm"], o["k_norm"], o["bqkv"], o["bo"],
                                    o["sinks"], o["post_norm"])


def _same_bits(layout, kv_type, positions, extras, seed=0):
    mats, wo = _mats(layout)
    o = _vectors(seed, extras)
    batch = _batch(positions)
    x = np.random.default_rng(seed + 1).standard_normal((len(positions), D)).astype(np.float32)
    kv_step, kv_ops = _filled_kv(kv_type, seed), _filled_kv(kv_type, seed)
    got = _step(x.copy(), mats, wo, kv_step, batch, o)
    assert got is not None
    want = _ops(x.copy(), mats, wo, kv_ops, batch, o)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert not np.array_equal(got[0], x)  # the residual moved
    for a, b in ((kv_step.k, kv_ops.k), (kv_step.v, kv_ops.v), (kv_step.k_scale, kv_ops.k_scale)):
        if a is not None:
            assert np.array_equal(a, b)


@pytest.mark.parametrize("layout", list(_TYPES))
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("positions", [[37], [300, 5, 70]])  # 300: two attention chunks
def test_same_bits_as_the_ops(layout, kv_type, positions):
    _same_bits(layout, kv_type, positions, ("norms",))


@pytest.mark.parametrize("extras", [(), ("biases",), ("sinks",), ("window",), ("post_norm", "norms"),
                                    ("biases", "sinks", "window", "post_norm")])
def test_same_bits_with_each_option(extras):
    _same_bits("qk_v", "f16", [300, 9], extras, seed=3)


def test_a_token_alone_gets_its_bits_from_a_batch():
    mats, wo = _mats("qk_v")
    o = _vectors(5, ("norms",))
    positions = [300, 5, 70]
    x = np.random.default_rng(6).standard_normal((3, D)).astype(np.float32)
    _, together = _step(x.copy(), mats, wo, _filled_kv("f16", 1), _batch(positions), o)
    for s, p in enumerate(positions):
        b = _batch(positions)  # the same blocks, one sequence's row alone
        alone = Batch(token_ids=b.token_ids[s : s + 1], positions=b.positions[s : s + 1],
                      seq_starts=np.array([0, 1], np.int32), seq_lens=b.seq_lens[s : s + 1],
                      block_tables=b.block_tables[s : s + 1], slot_mapping=b.slot_mapping[s : s + 1],
                      logits_indices=np.zeros(1, np.int32), block_size=BS)
        _, h = _step(x[s : s + 1].copy(), mats, wo, _filled_kv("f16", 1), alone, o)
        assert np.array_equal(h[0], together[s]), s


def test_none_where_it_does_not_apply_and_nothing_is_written():
    mats, wo = _mats("qk_v")
    o = _vectors(0, ())
    half = random_qtensor(T.F16, KVH * HD, D, seed=9, name="v16")
    for args in [((mats[0], half), wo, [7]),  # a projection of another kernel family (float)
                 (mats, random_qtensor(T.F16, D, NH * HD, seed=8, name="wo16"), [7]),
                 (mats, wo, [7, 8, 9, 10, 11, 12])]:  # past the gemv's batch
        kv = _filled_kv("f16", 0)
        before = kv.k.copy()
        x = np.ones((len(args[2]), D), np.float32)
        assert _step(x, args[0], args[1], kv, _batch(args[2]), o) is None
        assert np.array_equal(kv.k, before) and np.all(x == 1)
    x = np.ones((1, 2 * D), np.float32)[:, ::2]  # not C-contiguous
    assert _step(x, mats, wo, _filled_kv("f16", 0), _batch([7]), o) is None


def test_bad_slot_and_block_table_raise_as_the_ops_do():
    mats, wo = _mats("qk_v")
    o = _vectors(0, ())
    x = np.ones((1, D), np.float32)
    b = _batch([7])
    b.slot_mapping[0] = BLOCKS * BS + 3
    with pytest.raises(ValueError, match="slot out of range"):
        _step(x, mats, wo, _filled_kv("f16", 0), b, o)
    b = _batch([40])
    b.block_tables[0, 1] = -1  # position 40's keys 16-31 have no block
    with pytest.raises(ValueError, match="block table entry"):
        _step(x, mats, wo, _filled_kv("f16", 0), b, o)
    assert np.all(x == 1)  # the residual is untouched on an error


@pytest.mark.parametrize("positions", [[37], [300, 5]])
def test_a_moe_layer_whole_in_one_call(positions):
    """With moe_block_step's arguments the step also runs the routed block on its h and adds it
    to x: the bits of the attention ops, moe_block_step and add one after another."""
    from edged.backends.cpu.kquant_pairs import paired

    mats, wo = _mats("qk_v")
    o = _vectors(2, ("norms",))
    E, FF = 8, 256
    stack = lambda qt, m, k, s, name: paired(QTensor(name, qt, (E, m, k), random_qtensor(qt, E * m, k, seed=s).data))  # noqa: E731
    router = random_qtensor(T.F32, E, D, seed=11, name="router")
    moe = (router, 2, "softmax", True, 1.0, None, None, stack(T.Q4_K, FF, D, 12, "g"), stack(T.Q4_K, FF, D, 13, "u"),
           stack(T.Q6_K, D, FF, 14, "d"), "silu")
    batch = _batch(positions)
    x = np.random.default_rng(3).standard_normal((len(positions), D)).astype(np.float32)
    kv_step, kv_ops = _filled_kv("f16", 2), _filled_kv("f16", 2)
    got = cpu.attention_block_step(x.copy(), o["attn_norm"], mats, wo, o["ffn_norm"], kv_step, batch, ROPE, EPS, SCALE,
                                   0, 0.0, o["q_norm"], o["k_norm"], moe=moe)
    assert got is not None and got[1] is None
    xw, h = _ops(x.copy(), mats, wo, kv_ops, batch, o)
    want = cpu.add(xw, cpu.moe_block_step(*moe[:10], h, "silu"), out=xw)
    assert np.array_equal(got[0], want)
    assert np.array_equal(kv_step.k, kv_ops.k)
    not_silu = (*moe[:10], "gelu_tanh")  # a block moe_block_step does not take: the attention block alone
    alone = cpu.attention_block_step(x.copy(), o["attn_norm"], mats, wo, o["ffn_norm"], kv_step, batch, ROPE, EPS,
                                     SCALE, 0, 0.0, o["q_norm"], o["k_norm"], moe=not_silu)
    assert alone[1] is not None and np.array_equal(alone[1], h)


def _ffn_weights(layout, ff=512):
    """(gate or None, up, down) as the backend holds them: gate|up fused in one matrix of one
    type (Gemma 3's Q5_0) or gate and up apart (K-quants), down of another type."""
    if layout == "fused":
        gu = random_qtensor(T.Q5_0, 2 * ff, D, seed=21, name="gate_up")
        down = random_qtensor(T.Q6_K, D, ff, seed=22, name="down")
        return None, cpu.upload_matrix(gu), cpu.upload_matrix(down)
    gate, up = (random_qtensor(T.Q4_K, ff, D, seed=s, name=n) for s, n in ((23, "gate"), (24, "up")))
    down = random_qtensor(T.Q8_0, D, ff, seed=25, name="down")
    return tuple(cpu.upload_matrix(w) for w in (gate, up, down))


def _ffn_ops(x, h, gate, up, down, act, post):
    """What models/ffn.py and the decoder run after the attention block: x += post(down(act(...)))."""
    if gate is None:
        gu = cpu.matmul(up, h)
        half = gu.shape[1] // 2
        g, u = cpu.slice_cols(gu, 0, half), cpu.slice_cols(gu, half, 2 * half)
    else:
        g, u = cpu.matmuls((gate, up), h)
    f = cpu.matmul(down, cpu.silu_mul(g, u) if act == "silu" else cpu.gelu_tanh_mul(g, u))
    if post is not None:
        f = cpu.rms_norm(f, post, EPS)
    return cpu.add(x, f, out=x)


@pytest.mark.parametrize("layout, act, post", [("fused", "gelu_tanh", True), ("fused", "silu", False),
                                               ("apart", "silu", False), ("apart", "gelu_tanh", True)])
@pytest.mark.parametrize("positions", [[37], [300, 5, 70]])
def test_a_dense_layer_whole_in_one_call(layout, act, post, positions):
    """With a dense layer's FFN the step also runs it on its h and adds it to x: the bits of the
    attention ops, the gated FFN's matmuls and activation, the post-FFN norm and add."""
    mats, wo = _mats("legacy_qk_v")
    o = _vectors(7, ("norms", "post_norm") if post else ("norms",))
    gate, up, down = _ffn_weights(layout)
    post_ffn = np.random.default_rng(9).uniform(0.5, 1.5, D).astype(np.float32) if post else None
    batch = _batch(positions)
    x = np.random.default_rng(8).standard_normal((len(positions), D)).astype(np.float32)
    kv_step, kv_ops = _filled_kv("f16", 3), _filled_kv("f16", 3)
    got = cpu.attention_block_step(x.copy(), o["attn_norm"], mats, wo, o["ffn_norm"], kv_step, batch, ROPE, EPS, SCALE,
                                   0, 0.0, o["q_norm"], o["k_norm"], post_norm=o["post_norm"],
                                   ffn=(gate, up, down, act, post_ffn))
    assert got is not None and got[1] is None
    xw, h = _ops(x.copy(), mats, wo, kv_ops, batch, o)
    want = _ffn_ops(xw, h, gate, up, down, act, post_ffn)
    assert np.array_equal(got[0], want)
    assert np.array_equal(kv_step.k, kv_ops.k)


def test_a_dense_ffn_the_step_does_not_take_leaves_the_attention_block_alone():
    """Another activation (gpt-oss's clamped SwiGLU), or a down projection with no gemv here (F16):
    the step runs the attention block alone and returns its h, as without ffn."""
    mats, wo = _mats("qk_v")
    o = _vectors(2, ("norms",))
    gate, up, down = _ffn_weights("apart")
    down16 = random_qtensor(T.F16, D, 512, seed=26, name="down16")
    batch = _batch([37])
    x = np.random.default_rng(4).standard_normal((1, D)).astype(np.float32)
    _, want_h = _ops(x.copy(), mats, wo, _filled_kv("f16", 1), batch, o)
    for ffn in ((gate, up, down, "swiglu_oai", None), (gate, up, down16, "silu", None)):
        got = cpu.attention_block_step(x.copy(), o["attn_norm"], mats, wo, o["ffn_norm"], _filled_kv("f16", 1), batch,
                                       ROPE, EPS, SCALE, 0, 0.0, o["q_norm"], o["k_norm"], ffn=ffn)
        assert got is not None and got[1] is not None and np.array_equal(got[1], want_h), ffn[3]


def test_kept_arguments_follow_the_weights_and_the_batch():
    """What the step keeps between calls (on wo) is looked up by the objects it was given and the
    batch size: other q|k|v weights, another norm, or more tokens after a first call give the
    ops' bits for those, never the kept ones."""
    mats, wo = _mats("qk_v")
    other, _ = _mats("qkv")
    o = _vectors(4, ("norms",))
    x = np.random.default_rng(8).standard_normal((3, D)).astype(np.float32)
    for m, positions, norm in ((mats, [37], None), (other, [37], None), (other, [300, 5, 70], None),
                               (other, [300, 5, 70], np.linspace(2, 3, D, dtype=np.float32))):
        oo = dict(o, ffn_norm=norm) if norm is not None else o
        b = _batch(positions)
        got = _step(x[: len(positions)].copy(), m, wo, _filled_kv("f16", 4), b, oo)
        want = _ops(x[: len(positions)].copy(), m, wo, _filled_kv("f16", 4), b, oo)
        assert np.array_equal(got[1], want[1])
