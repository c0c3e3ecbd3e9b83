"""The op set a model may call, the flat batch every forward pass takes, and the parameters both
backends read the same way (RopeParams, the KV cache shape, the keys attention visits: key_chunk).

Models call only these ops (through a backend module such as `edged.backends.cpu`), so the CPU and
CUDA backends are interchangeable per layer. Shapes use numpy order; all activations are float32.

    matmul(w: QTensor, x [n, k]) -> [n, m]          y = x @ W.T, W stored as GGUF blocks
    embed(w: QTensor, ids int32 [n]) -> [n, k]      row gather + dequantize
    rms_norm(x [n, d], weight [d], eps) -> [n, d]   (q/k norms: x reshaped to [n*heads, head_dim])
    rope(x [n, heads, hd], positions int32 [n], rope: RopeParams) -> [n, heads, hd]
    gelu_tanh_mul(gate [n, f], up [n, f]) -> [n, f];  silu_mul(gate, up) -> [n, f]
    swiglu_oai_mul(gate, up) -> [n, f]   (gpt-oss's clamped SwiGLU; CPU backend only)
    store_kv(kv: LayerKV, k [n, kvh, hd], v [n, kvh, hd], slot_mapping int32 [n]) -> None
        (rows converted to the cache's KV type: f16 round-to-nearest-even, q8_0 per 32 features)
    rope_store_kv(q [n, h, hd], k, v [n, kvh, hd], kv, positions, slot_mapping, rope, eps, q_norm, k_norm)
        -> rope(q') [n, h, hd], with rope(k') and v stored; x' = rms_norm per head (norms [hd] or None)
        (optional: one fused call where a backend has it, else rope_store_kv_by_ops composes it)
    attention(q [n, h, hd], kv: LayerKV, batch: Batch, scale, window, softcap, sinks) -> [n, h, hd]
        (sinks float32 [h] or None: a per-head logit in the softmax denominator only, gpt-oss)
    add(a, b, out=None) (b same shape or a bias row [d]);  scale(x, s, out=None);  softcap(x, cap)
    allocate_kv(num_blocks, block_size, n_kv_heads, head_dim, kv_type="f16") -> LayerKV
        (in the backend's memory; kv_type one of KV_TYPES)
    moe_combine(ys: list of [m_i, d], src int32 [n, c], weights float32 [n, c]) -> [n, d]
        out[t] = sum_j weights[t, j] * Y[src[t, j]], j in order, Y = ys's rows concatenated
        (the mixture-of-experts sum; src and weights are host arrays: the routing runs on the host.
        CPU only: placement keeps MoE layers off a backend without it, models/moe.py)
    moe_ffn_step(gate, up, down, h, tokens, experts, cuts, src, weights, act) -> [n, d] or None
        (optional, CPU: the routed experts' gated FFN and moe_combine in one call where every group
        is small, same bits; None where it does not apply)
    moe_block_step(router, k, gating, norm_topk, scale, gate_b, probs_b, gate, up, down, h, act)
        -> [n, d] or None (optional, CPU: the router's matmul and the routing too, at decode)
    attention_block_step(x [n, d], attn_norm, mats, wo, ffn_norm, kv, batch, rope, eps, scale, window, softcap,
                         q_norm, k_norm, bqkv, bo, sinks, post_norm, moe, ffn) -> (x, h [n, d]) or None
        (optional, CPU: rms_norm, the q|k|v matmuls, rope_store_kv, attention, wo, the residual add
        (x in place) and rms_norm by ffn_norm in one call at decode, same bits; None where it does
        not apply. moe: moe_block_step's arguments but h; ffn: a dense layer's (gate, up, down, act,
        post_ffn_norm): to run that block and its residual add in the same call where it applies
        too, returning (x, None))
    layers_step(x [n, d], steps, kvs, batch) -> x or None
        (optional, CPU: every layer of a decode step in one call, in place, where each is a dense
        layer attention_block_step runs whole; steps[i]: its arguments but x, kv and batch, in the
        decoder's order. None where it does not apply to every layer: nothing is run then)

Placement and layout (arrays stay in the backend's memory between ops; host numpy on the CPU):
    upload(host array) -> array;  to_host(array) -> numpy;  upload_matrix(QTensor) -> weight handle
    prepare_batch(Batch) -> Batch with the backend's copies of the metadata (once per step)
    take_rows(x [n, ...], rows int32 [r]) -> [r, ...];  slice_cols(x [n, c], a, b) -> [n, b - a]
"""

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass
class RopeParams:
    """Rotary embedding of the first `dim` features of each head."""

    dim: int
    freq_base: float
    neox: bool  # True: rotate pairs (i, i + dim/2) (Gemma, Qwen, Phi-3); False: pairs (2i, 2i+1) (Llama)
    freq_scale: float = 1.0  # linear scaling: positions multiplied by this
    freq_factors: np.ndarray | None = None  # float32 [dim/2]: per-frequency divisors (Llama 3 rope_freqs)
    # YaRN (ggml_rope_ext's last four arguments): ext_factor 0 = off; else each pair's angle mixes
    # the interpolated (freq_scale) and extrapolated (unscaled) one by a ramp over the pairs
    # between the correction dims of beta_fast/beta_slow rotations in orig_ctx positions, and
    # cos/sin are scaled by attn_factor * (1 + 0.1 ln(1/freq_scale))
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    orig_ctx: int = 0  # the context the model was trained at before the extension
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass
class Batch:
    """One engine step, flattened: the tokens of each sequence are contiguous.

    Sequence s owns tokens seq_starts[s]:seq_starts[s+1]; after this step its context holds
    seq_lens[s] tokens whose KV lives in blocks block_tables[s, :ceil(seq_lens[s]/block_size)].
    When sliding-window layers have their own KV blocks (edged.kv.manager's second group), they
    read window_block_tables / window_slot_mapping instead, whose entries before a token's window
    may be -1; None means every layer uses block_tables / slot_mapping.
    """

    token_ids: np.ndarray  # int32 [n_tokens]
    positions: np.ndarray  # int32 [n_tokens]: position of each token in its sequence
    seq_starts: np.ndarray  # int32 [n_seqs + 1]
    seq_lens: np.ndarray  # int32 [n_seqs]: context length after this step
    block_tables: np.ndarray  # int32 [n_seqs, max_blocks_per_seq] (unused entries -1)
    slot_mapping: np.ndarray  # int32 [n_tokens]: block_id * block_size + offset where KV is written
    logits_indices: np.ndarray  # int32 [n_out]: rows of the batch whose logits are returned
    block_size: int = 16
    window_block_tables: np.ndarray | None = None  # int32 [n_seqs, max_window_blocks] (-1: none)
    window_slot_mapping: np.ndarray | None = None  # int32 [n_tokens]

    @classmethod
    def single(cls, token_ids, start: int, num_blocks: int, block_size: int = 16,
               logits_indices=None) -> "Batch":
        """One sequence stored in blocks 0..num_blocks-1 in order, adding `token_ids` at positions
        start.. (warm-up, perplexity, benchmarks); logits for the last token unless given."""
        ids = np.asarray(token_ids, dtype=np.int32)  # [n]
        n = ids.shape[0]
        pos = np.arange(start, start + n, dtype=np.int32)  # [n]
        if logits_indices is None:
            logits_indices = np.array([n - 1], dtype=np.int32)
        return cls(token_ids=ids, positions=pos, seq_starts=np.array([0, n], dtype=np.int32),
                   seq_lens=np.array([start + n], dtype=np.int32),
                   block_tables=np.arange(num_blocks, dtype=np.int32)[None, :], slot_mapping=pos.copy(),
                   logits_indices=np.asarray(logits_indices, dtype=np.int32), block_size=block_size)

    def window_view(self) -> "Batch":
        """The batch as a sliding-window layer reads it: its own tables and slots, if any."""
        if self.window_block_tables is None:
            return self
        return dataclasses.replace(self, block_tables=self.window_block_tables,
                                   slot_mapping=self.window_slot_mapping)

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def n_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


def key_chunk(p, window, c, chunk):
    """Keys [j0, j1) of chunk c of those a token at position p attends to: lo .. p, where
    lo = p - window + 1 under a sliding window (window > 0), else 0. Chunks of `chunk` keys start
    at lo, so a token's chunk boundaries depend on the token alone. Plain Python: each backend
    compiles it into its attention kernel."""
    lo = 0
    if window > 0 and p - window + 1 > 0:
        lo = p - window + 1
    j0 = lo + c * chunk
    return j0, min(j0 + chunk, p + 1)


def check_sinks(sinks, n_heads: int) -> np.ndarray:
    """Attention sinks as contiguous float32 [n_heads] (an empty [0] array for None); ValueError
    on another shape."""
    if sinks is None:
        return np.empty(0, dtype=np.float32)
    sinks = np.ascontiguousarray(sinks, dtype=np.float32)
    if sinks.shape != (n_heads,):
        raise ValueError(f"attention: sinks shape {sinks.shape} != ({n_heads},) (one logit per query head)")
    return sinks


# KV cache element types (--kv-type): float32, IEEE half, or llama.cpp's q8_0 (int8 values, one
# float16 scale d = amax / 127 per 32 features of a head's row)
KV_TYPES = ("f32", "f16", "q8_0")
KV_DEFAULT = "f16"  # llama.cpp's default (-ctk f16 -ctv f16)
Q8_KV_BLOCK = 32  # q8_0: features per scale
# f16 stores and q8_0 scales saturate here (both backends): past it fptrunc gives inf, and one inf
# key made a whole row's logits NaN (found by fuzzing the load path with the f16 default)
F16_MAX = np.float32(65504.0)


def check_kv_type(kv_type: str, head_dim: int) -> str:
    """kv_type if the cache can hold it for this head_dim; ValueError naming --kv-type otherwise."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"--kv-type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
    if kv_type == "q8_0" and head_dim % Q8_KV_BLOCK:
        raise ValueError(f"--kv-type q8_0 needs head_dim a multiple of {Q8_KV_BLOCK}, the model has {head_dim}")
    return kv_type


def kv_row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one token's K (or V) row of one kv head: 4 hd (f32), 2 hd (f16), or hd int8
    values + a 2-byte scale per 32 (q8_0: 34 bytes per 32 features, as block_q8_0)."""
    check_kv_type(kv_type, head_dim)
    if kv_type == "f32":
        return 4 * head_dim
    if kv_type == "f16":
        return 2 * head_dim
    return head_dim + 2 * (head_dim // Q8_KV_BLOCK)


def kv_shape(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int) -> tuple:
    """(num_blocks, block_size, n_kv_heads, head_dim) as ints; ValueError naming a size <= 0."""
    for name, v in (("num_blocks", num_blocks), ("block_size", block_size),
                    ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
        if int(v) <= 0:
            raise ValueError(f"allocate_kv: {name} must be > 0, got {v}")
    return int(num_blocks), int(block_size), int(n_kv_heads), int(head_dim)


@dataclass
class LayerKV:
    """One layer's paged KV cache, indexed by block id. q8_0 keeps block_q8_0's fields as two
    planes: int8 values in k / v and their float16 scales in k_scale / v_scale (34 bytes per 32)."""

    k: np.ndarray  # [num_blocks, block_size, n_kv_heads, head_dim]: float32 (f32), float16 (f16), int8 (q8_0)
    v: np.ndarray  # like k
    k_scale: np.ndarray | None = None  # q8_0: float16 [num_blocks, block_size, n_kv_heads, head_dim / 32]
    v_scale: np.ndarray | None = None  # q8_0: like k_scale

    @property
    def block_size(self) -> int:
        return int(self.k.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of K and V (and their q8_0 scales)."""
        planes = (self.k, self.v, self.k_scale, self.v_scale)
        return sum(int(p.nbytes) for p in planes if p is not None)

    @property
    def kv_type(self) -> str:
        """"f32", "f16" or "q8_0", from the element type of k."""
        return {"float32": "f32", "float16": "f16", "int8": "q8_0"}[str(self.k.dtype)]


def rope_store_kv_by_ops(ops, q, k, v, kv: LayerKV, positions, slot_mapping, rope: RopeParams, eps: float,
                         q_norm=None, k_norm=None):
    """rope_store_kv through backend `ops`' rms_norm, rope and store_kv, one after another (its
    definition; a backend's fused op gives the same bits)."""
    n, nh, hd = q.shape
    if q_norm is not None:
        q = ops.rms_norm(q.reshape(n * nh, hd), q_norm, eps).reshape(q.shape)
        k = ops.rms_norm(k.reshape(n * k.shape[1], hd), k_norm, eps).reshape(k.shape)
    q, k = ops.rope(q, positions, rope), ops.rope(k, positions, rope)
    ops.store_kv(kv, k, v, slot_mapping)
    return q
