"""The backend op set (backends/base.py) in plain numpy float32: a slow, obviously-correct test
backend with the same function names and signatures as edged.backends.cpu.

Weights are dequantized with gguf-py (reference_dequantize) once per tensor and cached.
"""

import numpy as np

from edged.backends.base import KV_DEFAULT, Batch, LayerKV, RopeParams, check_kv_type
# placement/layout and elementwise ops are plain numpy already: the CPU backend's serve as reference
from edged.backends.cpu.activations import add, scale  # noqa: F401
from edged.backends.cpu.host import prepare_batch, slice_cols, take_rows, to_host, upload  # noqa: F401
from edged.quant.tensor import QTensor
from tests.helpers.qdata import reference_dequantize
from tests.helpers.rope_reference import rope_frequencies, rope_params_yarn

_DEQUANT_CACHE: dict[int, tuple[QTensor, np.ndarray]] = {}


def _weights(w: QTensor) -> np.ndarray:
    hit = _DEQUANT_CACHE.get(id(w))
    if hit is None or hit[0] is not w:  # keep w alive so its id is not reused while cached
        hit = (w, reference_dequantize(w))
        _DEQUANT_CACHE[id(w)] = hit
    return hit[1]


def clear_cache() -> None:
    """Drop cached dequantized weights."""
    _DEQUANT_CACHE.clear()


def upload_matrix(w: QTensor) -> QTensor:
    """Weights stay GGUF's (not the CPU backend's grouped rows): gguf-py dequantizes them."""
    return w


def matmul(w: QTensor, x: np.ndarray, **_) -> np.ndarray:
    """x [n, k] @ W.T → [n, m]."""
    return np.ascontiguousarray(x, dtype=np.float32) @ _weights(w).T


def embed(w: QTensor, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of W, dequantized: [n, k]."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        raise ValueError(f"token id out of range [0, {w.shape[0]})")
    return _weights(w)[ids].copy()


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) * weight over the last axis."""
    x64 = x.astype(np.float64)
    r = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return ((x64 * r).astype(np.float32) * weight).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, p: RopeParams) -> np.ndarray:
    """Rotary embedding of the first p.dim features of each head (YaRN from the paper's
    formulation, tests/helpers/rope_reference.py). x [n, heads, hd]."""
    half = p.dim // 2
    inv, mscale = rope_frequencies(p.dim, p.freq_base, p.freq_scale, p.freq_factors, rope_params_yarn(p))
    theta = positions.astype(np.float64)[:, None] * inv[None, :]  # [n, half]
    cos, sin = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
    out = x.astype(np.float32).copy()
    if p.neox:
        a, b = x[..., :half], x[..., half : p.dim]
        out[..., :half] = a * cos - b * sin
        out[..., half : p.dim] = a * sin + b * cos
    else:
        a, b = x[..., 0 : p.dim : 2], x[..., 1 : p.dim : 2]
        out[..., 0 : p.dim : 2] = a * cos - b * sin
        out[..., 1 : p.dim : 2] = a * sin + b * cos
    return out


def gelu_tanh_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up."""
    g = gate.astype(np.float64)
    gelu = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3)))
    return (gelu * up).astype(np.float32)


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up."""
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


def swiglu_oai_mul(gate: np.ndarray, up: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """min(gate, limit) * sigmoid(alpha * min(gate, limit)) * (clamp(up, -limit, limit) + 1) (gpt-oss)."""
    x = np.minimum(gate.astype(np.float64), limit)
    return (x / (1.0 + np.exp(-alpha * x)) * (np.clip(up.astype(np.float64), -limit, limit) + 1.0)).astype(np.float32)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap)."""
    return (cap * np.tanh(x.astype(np.float64) / cap)).astype(np.float32)


def moe_combine(ys, src: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """out[t] = sum_j weights[t, j] * Y[src[t, j]] with Y = ys's rows concatenated: [n, d]."""
    y = np.concatenate([np.asarray(a, dtype=np.float64) for a in ys])  # [m, d]
    return np.einsum("nc,ncd->nd", weights.astype(np.float64), y[src]).astype(np.float32)


def allocate_kv(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                kv_type: str = KV_DEFAULT) -> LayerKV:
    """Zeroed paged cache [num_blocks, block_size, n_kv_heads, head_dim] for K and V: float32,
    float16, or q8_0 (int8 values + float16 scales [.., head_dim / 32])."""
    check_kv_type(kv_type, head_dim)
    shape = (num_blocks, block_size, n_kv_heads, head_dim)
    if kv_type == "q8_0":
        sshape = (*shape[:3], head_dim // 32)
        return LayerKV(k=np.zeros(shape, np.int8), v=np.zeros(shape, np.int8),
                       k_scale=np.zeros(sshape, np.float16), v_scale=np.zeros(sshape, np.float16))
    dtype = np.float32 if kv_type == "f32" else np.float16
    return LayerKV(k=np.zeros(shape, dtype), v=np.zeros(shape, dtype))


def q8_0_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [..., hd] as quantize_row_q8_0: (q int8 [..., hd], d float16 [..., hd / 32]) with
    d = amax / 127 per 32 and q = rint(x * (1 / d))."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)  # [..., hd / 32, 1]
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    return np.rint(b * inv).astype(np.int8).reshape(x.shape), d[..., 0].astype(np.float16)


def kv_values(kv: LayerKV, blocks, offs) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) float64 [len(blocks), kvh, hd] of the given slots, as the cache's type holds them."""
    def one(x, s):
        if s is None:
            return x[blocks, offs].astype(np.float64)
        return x[blocks, offs].astype(np.float64) * np.repeat(s[blocks, offs].astype(np.float64), 32, axis=-1)

    return one(kv.k, kv.k_scale), one(kv.v, kv.v_scale)


def store_kv(kv: LayerKV, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Write token rows of k, v [n, kvh, hd] at slots block_id * block_size + offset, converted to
    the cache's type (numpy's float16 cast: round to nearest even)."""
    bs = kv.block_size
    blocks, offs = slot_mapping // bs, slot_mapping % bs
    if kv.k_scale is None:
        kv.k[blocks, offs] = k
        kv.v[blocks, offs] = v
        return
    kv.k[blocks, offs], kv.k_scale[blocks, offs] = q8_0_rows(k)
    kv.v[blocks, offs], kv.v_scale[blocks, offs] = q8_0_rows(v)


def attention(q: np.ndarray, kv: LayerKV, batch: Batch, scale: float, window: int = 0,
              softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """Causal (optionally sliding-window) GQA attention over the paged cache. q [n, h, hd].
    sinks [h]: a logit per head that joins the softmax denominator only."""
    n, h, hd = q.shape
    kvh = kv.k.shape[2]
    group = h // kvh
    bs = kv.block_size
    out = np.zeros((n, h, hd), np.float32)
    for s in range(batch.n_seqs):
        a, b = int(batch.seq_starts[s]), int(batch.seq_starts[s + 1])
        L = int(batch.seq_lens[s])
        j = np.arange(L)
        blocks = batch.block_tables[s, j // bs]
        K, V = kv_values(kv, blocks, j % bs)  # [L, kvh, hd]
        for t in range(a, b):
            p = int(batch.positions[t])
            allowed = j <= p
            if window > 0:
                allowed &= p - j < window
            for hh in range(h):
                sc = K[:, hh // group] @ q[t, hh].astype(np.float64) * scale  # [L]
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                sc = np.where(allowed, sc, -np.inf)
                m = sc.max() if sinks is None else max(sc.max(), float(sinks[hh]))
                w = np.exp(sc - m)
                denom = w.sum() + (0.0 if sinks is None else np.exp(float(sinks[hh]) - m))
                out[t, hh] = (w / denom) @ V[:, hh // group]
    return out


def _q8_32_round_trip(x: np.ndarray) -> np.ndarray:
    """x [n, k] through int8 blocks of 32 with a float32 scale amax/127 (the CPU backend's q8_32)."""
    n, k = x.shape
    b = x.reshape(n, k // 32, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
    return (np.round(b * inv) * d).reshape(n, k).astype(np.float32)


class Q8ActivationOps:
    """numpy ops whose matmul first rounds x through q8_32 blocks when the weight type's activation
    format is "q8_32" (quant/types.py): the CPU backend's numerics in plain numpy, so its output can
    be checked tightly rather than within quantization noise."""

    def __getattr__(self, name):
        try:
            return globals()[name]
        except KeyError:
            raise AttributeError(name) from None

    @staticmethod
    def matmul(w: QTensor, x: np.ndarray, **_) -> np.ndarray:
        from edged.quant.types import traits

        if traits(w.qtype).act_format == "q8_32":
            x = _q8_32_round_trip(np.ascontiguousarray(x, dtype=np.float32))
        return matmul(w, x)


q8_activation_ops = Q8ActivationOps()
