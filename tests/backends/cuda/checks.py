"""Checks shared by the simulator tests (tests/backends/cuda, tiny shapes) and the device tests
(tests/gpu, real shapes): every CUDA op against the CPU backend on the same inputs, matmul and
embed also against gguf-py's dequantizer + numpy.

Bound (matmul): |gpu - cpu| <= 1e-5 · (|cpu| + Σ|x| · max|w|) per output — both quantize x the
same way and compute the same exact int32 block dots with the same per-block float formula; only
the order of the float sums differs. The same bound holds against matmul_reference (x quantized
as the CPU does, in numpy, times the dequantized weights in float64), which the device tests use
where compiling the CPU kernels from a cold cache would take minutes.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends import cpu
from edged.backends.base import Batch, RopeParams
from edged.backends.cpu.attention import allocate_kv as cpu_allocate_kv
from edged.backends.cpu.attention import attention as cpu_attention
from edged.backends.cpu.attention import store_kv as cpu_store_kv
from edged.quant.tensor import QTensor
from tests.helpers.qdata import random_qtensor, reference_dequantize

FLOAT_TYPES = (T.F32, T.F16, T.BF16)
ALL_TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K,
             T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS)
MATMUL_RTOL = 1e-5


def ops():
    from edged.backends.cuda import ops as cuda_ops

    return cuda_ops


def weight(qtype, m: int, k: int, seed: int = 0) -> QTensor:
    """A random QTensor [m, k] of any supported type (float types from normal values)."""
    qtype = T(qtype)
    if qtype not in FLOAT_TYPES:
        return random_qtensor(qtype, m, k, seed=seed)
    wf = (np.random.default_rng(seed).standard_normal((m, k)) * 0.05).astype(np.float32)  # [m, k]
    if qtype == T.F32:
        raw = wf.view(np.uint8)
    elif qtype == T.F16:
        raw = wf.astype(np.float16).view(np.uint8)
    else:
        raw = (wf.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return QTensor("w", qtype, (m, k), np.ascontiguousarray(raw).reshape(-1))


def np_quantize(x: np.ndarray):
    """backends/cpu/act_quant.py in numpy (the same float32 operations): x [n, k] -> (xq int8 [n, k],
    xd float32 [n, k/32], xs int32 [n, k/32])."""
    n, k = x.shape
    xb = x.reshape(n, k // 32, 32)
    d = (np.abs(xb).max(axis=2) / np.float32(127.0)).astype(np.float32)  # [n, k/32]
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = np.rint(xb * inv[:, :, None]).astype(np.int32)  # [n, k/32, 32]
    return q.reshape(n, k).astype(np.int8), d, q.sum(axis=2).astype(np.int32)


def matmul_reference(w: QTensor, x: np.ndarray, ref_w: np.ndarray) -> np.ndarray:
    """What the kernels compute, in float64: x (int8-quantized as the CPU does, for block types)
    times gguf-py's dequantized weights."""
    if T(w.qtype) in FLOAT_TYPES:
        xr = x.astype(np.float64)
    else:
        xq, xd, _ = np_quantize(x)
        xr = xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 32, axis=1)
    return xr @ ref_w.astype(np.float64).T


def check_matmul(qtype, m: int, k: int, ns, seed: int = 0, against_cpu: bool = True) -> None:
    """For each n: GPU matmul within the bound of the CPU backend's result (against_cpu) and of
    matmul_reference (the same maths in float64), and as close to dequantize + numpy as the CPU."""
    o = ops()
    w = weight(qtype, m, k, seed)
    wd = o.upload_matrix(w)
    ref_w = reference_dequantize(w)  # [m, k]
    wmax = float(np.abs(ref_w).max())
    name = f"{T(qtype).name} n=%d m={m} k={k}"
    for n in ns:
        x = np.random.default_rng(seed + 100 + n).standard_normal((n, k)).astype(np.float32)  # [n, k]
        y = o.to_host(o.matmul(wd, o.upload(x)))
        scale = np.abs(x).sum(axis=1, keepdims=True) * wmax
        want = matmul_reference(w, x, ref_w)
        err = np.abs(y - want)
        bound = MATMUL_RTOL * (np.abs(want) + scale)
        assert np.all(err <= bound), f"{name % n}: |gpu - reference| up to {float((err / bound).max()):.2f}x the bound"
        if against_cpu:
            y_cpu = cpu.matmul(w, x)
            err = np.abs(y - y_cpu)
            bound = MATMUL_RTOL * (np.abs(y_cpu) + scale)
            assert np.all(err <= bound), f"{name % n}: |gpu - cpu| up to {float((err / bound).max()):.2f}x the bound"
        ref = x @ ref_w.T
        rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        rel_q = float(np.linalg.norm(want - ref) / np.linalg.norm(ref))
        assert rel <= rel_q + 1e-5, f"{name % n}: rel err vs numpy {rel:.5f} (quantized reference {rel_q:.5f})"


def check_embed(qtype, m: int, k: int, ids, seed: int = 0) -> None:
    o = ops()
    w = weight(qtype, m, k, seed)
    ids = np.asarray(ids, dtype=np.int32)
    got = o.to_host(o.embed(o.upload_matrix(w), ids))
    ref = reference_dequantize(w)[ids]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6 * float(np.abs(ref).max()) + 1e-30)
    np.testing.assert_allclose(got, cpu.embed(w, ids), rtol=0, atol=1e-6 * float(np.abs(ref).max()) + 1e-30)


def check_act_quant(n: int, k: int, seed: int = 0) -> None:
    """Device activation quantization is bit-identical to the CPU's (ties round to even)."""
    from edged.backends.cpu.act_quant import quantize_activations as cpu_quantize
    from edged.backends.cuda.act_quant import quantize_activations

    o = ops()
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    x[0, :32] = np.arange(32, dtype=np.float32) - 15.5  # x / d lands on halves: ties to even
    x[0, 31] = 127.0  # amax 127 -> d = 1
    if k >= 64:
        x[n - 1, 32:64] = 0.0  # an all-zero block: d = 0
    got = [o.to_host(a) for a in quantize_activations(o.upload(x))]
    for g, want in zip(got, cpu_quantize(x)):
        np.testing.assert_array_equal(g, want)


def check_rms_norm(n: int, d: int, seed: int = 0) -> None:
    o = ops()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32) * 3
    wt = rng.standard_normal(d).astype(np.float32)
    got = o.to_host(o.rms_norm(o.upload(x), o.upload(wt), 1e-6))
    np.testing.assert_allclose(got, cpu.rms_norm(x, wt, 1e-6), rtol=2e-6, atol=1e-6)


def check_rope(n: int, heads: int, hd: int, dim: int, neox: bool, factors: bool, seed: int = 0,
               yarn: bool = False) -> None:
    o = ops()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, heads, hd)).astype(np.float32)
    pos = rng.integers(0, 5000, n).astype(np.int32)
    ff = (1.0 + rng.random(dim // 2)).astype(np.float32) if factors else None
    p = RopeParams(dim=dim, freq_base=10000.0, neox=neox, freq_scale=0.5 if factors else 1.0, freq_factors=ff)
    if yarn:  # gpt-oss's YaRN (factor 32, 4096 original positions): ramp-mixed angles and mscale
        p = RopeParams(dim=dim, freq_base=150000.0, neox=neox, freq_scale=1 / 32, freq_factors=ff,
                       ext_factor=1.0, orig_ctx=4096)
    got = o.to_host(o.rope(o.upload(x), o.upload(pos), p))
    # cos/sin of angles up to ~5000 rad: float32 libm results differ by an ulp of the angle's size
    np.testing.assert_allclose(got, cpu.rope(x, pos, p), rtol=0, atol=1e-4)


def check_elementwise(n: int, f: int, seed: int = 0) -> None:
    o = ops()
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal((n, f)) * 4).astype(np.float32)
    u = rng.standard_normal((n, f)).astype(np.float32)
    dg, du = o.upload(g), o.upload(u)
    # tanh/exp in float32 may differ by an ulp or two between libms (and a device may fuse a
    # multiply-add): 1 + tanh(..) near -1 turns that into a small absolute error, hence atol
    np.testing.assert_allclose(o.to_host(o.gelu_tanh_mul(dg, du)), cpu.gelu_tanh_mul(g, u), rtol=4e-6, atol=4e-6)
    np.testing.assert_allclose(o.to_host(o.silu_mul(dg, du)), cpu.silu_mul(g, u), rtol=4e-6, atol=1e-6)
    np.testing.assert_allclose(o.to_host(o.softcap(dg, 5.0)), cpu.softcap(g, 5.0), rtol=4e-6, atol=2e-6)
    np.testing.assert_array_equal(o.to_host(o.add(dg, du)), g + u)
    row = rng.standard_normal(f).astype(np.float32)
    np.testing.assert_array_equal(o.to_host(o.add(dg, o.upload(row))), g + row)
    np.testing.assert_array_equal(o.to_host(o.scale(dg, 0.5)), g * np.float32(0.5))
    acc = o.upload(g)
    o.add(acc, du, out=acc)  # in place
    o.scale(acc, 2.0, out=acc)
    np.testing.assert_array_equal(o.to_host(acc), (g + u) * np.float32(2.0))
    rows = np.array([n - 1, 0, n - 1], dtype=np.int32)
    np.testing.assert_array_equal(o.to_host(o.take_rows(dg, rows)), g[rows])
    np.testing.assert_array_equal(o.to_host(o.take_rows(dg, o.upload(rows))), g[rows])
    g3 = g.reshape(n, 2, f // 2)
    np.testing.assert_array_equal(o.to_host(o.take_rows(o.upload(g3), rows)), g3[rows])
    np.testing.assert_array_equal(o.to_host(o.slice_cols(dg, 1, f - 2)), g[:, 1 : f - 2])


def attention_case(rng, bs: int, kvh: int, g: int, hd: int, seqs, spare_blocks: int = 3):
    """A paged cache in shuffled block ids holding each sequence's context, and a batch of each
    sequence's new tokens. seqs: (context before the step, new tokens). Returns (q, k_all, v_all,
    slots_all, batch): K/V for every stored position (new tokens included) and their slots."""
    blocks_per = [-(-(c + t) // bs) for c, t in seqs]
    num_blocks = sum(blocks_per) + spare_blocks
    ids = rng.permutation(num_blocks).astype(np.int32)
    width = max(blocks_per) + 1
    tables = np.full((len(seqs), width), -1, dtype=np.int32)
    o = 0
    for s, nb_ in enumerate(blocks_per):
        tables[s, :nb_] = ids[o : o + nb_]
        o += nb_
    pos, starts, slots_new, all_slots = [], [0], [], []
    for s, (c, t) in enumerate(seqs):
        p = np.arange(c, c + t, dtype=np.int32)
        pos.append(p)
        starts.append(starts[-1] + t)
        slot = lambda j: tables[s, j // bs] * bs + j % bs  # noqa: E731
        slots_new.append(np.array([slot(j) for j in p], dtype=np.int32))
        all_slots.append(np.array([slot(j) for j in range(c + t)], dtype=np.int32))
    positions = np.concatenate(pos)
    n = positions.shape[0]
    batch = Batch(token_ids=np.zeros(n, np.int32), positions=positions,
                  seq_starts=np.array(starts, np.int32), seq_lens=np.array([c + t for c, t in seqs], np.int32),
                  block_tables=tables, slot_mapping=np.concatenate(slots_new),
                  logits_indices=np.array([n - 1], np.int32), block_size=bs)
    slots = np.concatenate(all_slots)
    k = rng.standard_normal((slots.shape[0], kvh, hd)).astype(np.float32)
    v = rng.standard_normal((slots.shape[0], kvh, hd)).astype(np.float32)
    q = rng.standard_normal((n, kvh * g, hd)).astype(np.float32)
    return q, k, v, slots, batch, num_blocks


def check_attention(bs, kvh, g, hd, seqs, window=0, softcap=0.0, seed=0, sinks=None, kv_type="f32") -> None:
    """GPU attention == CPU attention on the same cache contents and batch (the stored K/V,
    converted to kv_type, bit-identical)."""
    o = ops()
    rng = np.random.default_rng(seed)
    q, k, v, slots, batch, num_blocks = attention_case(rng, bs, kvh, g, hd, seqs)
    scale = 1.0 / np.sqrt(hd)
    kv_cpu = cpu_allocate_kv(num_blocks, bs, kvh, hd, kv_type)
    cpu_store_kv(kv_cpu, k, v, slots)
    want = cpu_attention(q, kv_cpu, batch, scale, window, softcap, sinks)
    kv = o.allocate_kv(num_blocks, bs, kvh, hd, kv_type)
    o.store_kv(kv, o.upload(k), o.upload(v), o.upload(slots))
    for name in ("k", "v", "k_scale", "v_scale"):
        if getattr(kv_cpu, name) is not None:
            np.testing.assert_array_equal(o.to_host(getattr(kv, name)), getattr(kv_cpu, name))
    got = o.to_host(o.attention(o.upload(q), kv, o.prepare_batch(batch), scale, window, softcap, sinks))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
