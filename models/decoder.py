"""The decoder-only transformer every supported architecture is an instance of.

One layer, parameterized by which tensors exist (llama.cpp's graph builders differ in the same few
places):

    h = rms_norm(x, attn_norm)
    q, k, v = h @ Wq, h @ Wk, h @ Wv        (or one fused Wqkv; optional biases)
    q, k = rms_norm per head (optional q/k norms); rope(q), rope(k)    (per-layer RoPE params)
    store k, v in the paged cache; o = attention(q, cache, scale, window, softcap, sinks) @ Wo (+ bias)
    o = rms_norm(o, post_attn_norm)          (optional: Gemma's sandwich norm)
    x = x + o
    h = rms_norm(x, ffn_norm)
    f = (act(h @ Wgate) * (h @ Wup)) @ Wdown (or one fused Wgate|up; or a mixture of experts, models/moe.py)
    f = rms_norm(f, post_ffn_norm)           (optional)
    x = x + f

then logits = rms_norm(x, output_norm) @ Woutput (optional final softcap); `forward_hidden` also
returns rms_norm(x, output_norm) of chosen rows (what embeddings pool). The embedding lookup
runs on the host backend (the `ops` the model was loaded with); `place()` puts each layer and the
output projection on a backend (hybrid CPU/GPU offload): its weights are uploaded once, and the
activations cross each boundary between backends once per step.
"""

from dataclasses import dataclass, fields, is_dataclass, replace

import numpy as np

from edged.backends.base import Batch, LayerKV, RopeParams, check_kv_type, kv_row_bytes, rope_store_kv_by_ops
from edged.models.errors import ModelError
from edged.models.ffn import GATED_ACTIVATIONS, gated_ffn, matmuls
from edged.models.hparams import HParams
from edged.models.moe import MoEWeights, block_step_args, missing_ops as moe_missing_ops, moe_ffn
from edged.quant.tensor import QTensor


@dataclass
class AttentionWeights:
    """One layer's attention projections: separate q/k/v, one fused qkv (rows q|k|v), or fused qk
    (rows q|k) beside v where v's type differs (Q4_K_M files: q, k Q4_K and v Q6_K)."""

    wo: QTensor  # [n_embd, n_heads*head_dim]
    wq: QTensor | None = None  # [n_heads*head_dim, n_embd]
    wk: QTensor | None = None  # [n_kv_heads*head_dim, n_embd]
    wv: QTensor | None = None  # [n_kv_heads*head_dim, n_embd]
    wqkv: QTensor | None = None  # [(n_heads + 2*n_kv_heads)*head_dim, n_embd]
    wqk: QTensor | None = None  # [(n_heads + n_kv_heads)*head_dim, n_embd]: with wv, no wq / wk
    bq: np.ndarray | None = None  # float32 biases (Qwen2)
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # float32 [head_dim] (Gemma 3, Qwen3)
    k_norm: np.ndarray | None = None
    bo: np.ndarray | None = None  # float32 [n_embd]: output projection bias (gpt-oss)
    sinks: np.ndarray | None = None  # float32 [n_heads]: per-head sink logits in the softmax (gpt-oss)


@dataclass
class FeedForwardWeights:
    """Gated FFN: separate gate and up, or one fused up whose rows are gate|up (Phi-3)."""

    up: QTensor  # [n_ff, n_embd], or [2*n_ff, n_embd] when gate is None
    down: QTensor  # [n_embd, n_ff]
    gate: QTensor | None = None  # [n_ff, n_embd]


@dataclass
class LayerWeights:
    """One transformer block: its weights and its attention geometry."""

    attn_norm: np.ndarray  # float32 [n_embd]
    attn: AttentionWeights
    ffn_norm: np.ndarray  # float32 [n_embd]
    ffn: FeedForwardWeights | None  # None when `moe` is set
    rope: RopeParams
    window: int = 0  # sliding-window size, 0 = global attention
    post_attn_norm: np.ndarray | None = None  # float32 [n_embd]
    post_ffn_norm: np.ndarray | None = None  # float32 [n_embd]
    moe: MoEWeights | None = None  # a mixture-of-experts FFN instead of `ffn`


class DecoderModel:
    """A loaded model: weights (zero-copy QTensors), hyper-parameters and the forward pass.

    Built by an architecture module's `load(gf, ops)`; see the module docstring for the layer.
    """

    def __init__(
        self,
        hparams: HParams,
        token_embd: QTensor,
        output_norm: np.ndarray,
        output: QTensor,
        layers: list[LayerWeights],
        ops,
        *,
        attn_scale: float,
        ffn_act: str,
        embed_scale: float | None = None,
        final_softcap: float = 0.0,
        attn_softcap: float = 0.0,
    ):
        if ffn_act not in GATED_ACTIVATIONS:
            raise ModelError(f"unknown FFN activation {ffn_act!r}")
        self.hparams = hparams
        self.arch = hparams.arch
        self.token_embd = token_embd
        self.output_norm = output_norm
        self.output = output
        self.layers = layers
        self.attn_scale = float(attn_scale)
        self.ffn_act = ffn_act
        # llama.cpp multiplies the embeddings by a float32 scalar (Gemma: sqrtf(n_embd))
        self.embed_scale = None if embed_scale is None else np.float32(embed_scale)
        self.final_softcap = float(final_softcap)
        self.attn_softcap = float(attn_softcap)  # Gemma 2: cap * tanh(q.k * scale / cap) before softmax
        self.host_ops = ops
        # the KV cache's element type: float32 here (what the float64 reference forwards of the tests
        # compare with); edged.loader.load sets --kv-type's (default f16) before anything sizes KV
        self.kv_type = "f32"
        self.check_backend(ops)
        self.place([ops] * len(layers), ops)

    def place(self, layer_ops: list, output_ops) -> None:
        """Run layer i on backend `layer_ops[i]` and the final norm + output projection on
        `output_ops`, uploading each weight to its backend once (host weights stay in self.layers).

        KV caches must be allocated after placing (allocate_kv puts each layer's in its backend).
        """
        if len(layer_ops) != len(self.layers):
            raise ModelError(f"placement names {len(layer_ops)} backends for {len(self.layers)} layers")
        for i, (ops, lw) in enumerate(zip(layer_ops, self.layers)):
            if lw.moe is not None and ops is not self.host_ops and moe_missing_ops(ops):
                raise ModelError(f"layer {i} (blk.{i}): its mixture-of-experts weights cannot be placed on backend "
                                 f"{getattr(ops, '__name__', type(ops).__name__)}: it has no "
                                 f"{', '.join(moe_missing_ops(ops))} op; keep MoE layers on the host")
        for ops in {id(o): o for o in [*layer_ops, output_ops]}.values():
            if ops is not self.host_ops:  # each backend is checked on the weights it is given
                mine = [m for o, lw in zip(layer_ops, self.layers) if o is ops for m in layer_matrices(lw)]
                self.check_backend(ops, ([(self.output.name, self.output)] if output_ops is ops else []) + mine)
        self.layer_ops = list(layer_ops)
        self.output_ops = output_ops
        self._run_layers = [_placed(ops, _fused(ops, lw, self.host_ops), self.host_ops)
                            for ops, lw in zip(self.layer_ops, self.layers)]
        # each layer's arguments to a backend's attention_block_step: the same objects every step
        self._step_args = [self._attention_step_args(lw) for lw in self._run_layers]
        self._run_output = _placed(output_ops, self.output, self.host_ops)
        self._run_output_norm = _placed(output_ops, self.output_norm, self.host_ops)

    def matrices(self, placed: bool = False):
        """(name, QTensor) of every weight the forward multiplies by (output included): as
        loaded, or with placed=True as the forward runs them, for a model placed on the host
        (grouped rows where its matmul reads those: backends/cpu/host.upload_matrix)."""
        output, layers = (self._run_output, self._run_layers) if placed else (self.output, self.layers)
        yield output.name, output
        for lw in layers:
            yield from layer_matrices(lw)

    def layer_bytes(self, i: int) -> int:
        """Bytes of layer i's weights (what placing it on a device uploads)."""
        return _nbytes(self.layers[i])

    def output_bytes(self) -> int:
        """Bytes of the final norm and output projection (token_embd's when tied)."""
        return _nbytes(self.output) + _nbytes(self.output_norm)

    def check_backend(self, ops, matrices=None) -> None:
        """ModelError at load time when `ops` has no matmul kernel for the type of one of
        `matrices` ((name, QTensor) pairs; default every weight)."""
        why = unsupported_matrix(ops, self.matrices() if matrices is None else matrices)
        if why:
            raise ModelError(why)

    # --- the model interface the engine uses -------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_kv_heads(self) -> int:
        return self.hparams.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.hparams.head_dim

    @property
    def vocab_size(self) -> int:
        return self.hparams.vocab_size

    @property
    def context_length(self) -> int:
        return self.hparams.context_length

    def layer_window(self, i: int) -> int:
        """Sliding-window size of layer i (0 = global attention)."""
        return self.layers[i].window

    @property
    def kv_window(self) -> int:
        """The largest sliding window of any layer (0: every layer attends globally): KV blocks
        before a token's position - kv_window + 1 are never read by a sliding-window layer."""
        return max((lw.window for lw in self.layers), default=0)

    @property
    def kv_type(self) -> str:
        """"f32", "f16" or "q8_0": what allocate_kv gives and kv_bytes_per_token counts."""
        return self._kv_type

    @kv_type.setter
    def kv_type(self, kv_type: str) -> None:
        self._kv_type = check_kv_type(kv_type, self.hparams.head_dim)  # ValueError naming --kv-type

    def kv_bytes_per_token(self, sliding: bool | None = None, kv_type: str | None = None) -> int:
        """Bytes of K and V of kv_type (None: self.kv_type) one token occupies across all layers,
        or across only the sliding-window (sliding=True) or global-attention (sliding=False) layers."""
        n = sum(1 for lw in self.layers if sliding is None or (lw.window > 0) == sliding)
        return n * 2 * self.n_kv_heads * kv_row_bytes(kv_type or self.kv_type, self.head_dim)

    def kv_host_bytes(self, num_blocks: int, block_size: int = 16, window_num_blocks: int | None = None) -> int:
        """Bytes allocate_kv with these arguments takes in host RAM (the layers the host backend runs)."""
        row = 2 * self.n_kv_heads * kv_row_bytes(self.kv_type, self.head_dim) * block_size  # K and V of a block
        return sum(row * (window_num_blocks if window_num_blocks and lw.window else num_blocks)
                   for ops, lw in zip(self.layer_ops, self.layers) if ops is self.host_ops)

    def allocate_kv(self, num_blocks: int, block_size: int = 16,
                    window_num_blocks: int | None = None) -> list[LayerKV]:
        """One paged cache per layer, allocated by that layer's backend; with window_num_blocks
        the sliding-window layers get that many blocks (their own KV group, see forward)."""
        hp = self.hparams
        return [ops.allocate_kv(window_num_blocks if window_num_blocks and lw.window else num_blocks,
                                block_size, hp.n_kv_heads, hp.head_dim, self.kv_type)
                for ops, lw in zip(self.layer_ops, self.layers)]

    def forward(self, batch: Batch, kv: list[LayerKV]) -> np.ndarray:
        """Run one flat batch; returns float32 host logits [len(batch.logits_indices), vocab].

        Writes this step's K/V into `kv` at batch.slot_mapping before attending; sliding-window
        layers use batch.window_block_tables / window_slot_mapping instead when the batch has them.
        """
        return self.forward_hidden(batch, kv)[0]

    def forward_hidden(self, batch: Batch, kv: list[LayerKV], hidden_rows=None):
        """forward, also returning the final-normed hidden states (before the output projection)
        of the batch rows `hidden_rows` (int32 [h]): (logits [len(logits_indices), vocab],
        hidden float32 host [h, n_embd], or None without hidden_rows). Embedding requests take
        hidden rows in the same step as other requests' logits rows."""
        if len(kv) != len(self.layers):
            raise ModelError(f"{len(kv)} KV caches for {len(self.layers)} layers")
        n = batch.n_tokens
        idx = batch.logits_indices
        want_hidden = hidden_rows is not None and len(hidden_rows) > 0
        # rows carried through the last layer's FFN and the output norm (all: perplexity)
        keep = np.union1d(idx, hidden_rows).astype(np.int32) if want_hidden else idx
        rows = None if keep.shape[0] == n and np.array_equal(keep, np.arange(n)) else keep
        ops = self.host_ops
        x = ops.embed(self.token_embd, batch.token_ids)  # [n, n_embd]
        if self.embed_scale is not None:
            x = ops.scale(x, self.embed_scale, out=x)
        prepared = {}  # backend id -> this step's metadata in that backend's memory, per layer kind
        last = len(self.layers) - 1
        stack = self._layers_step(x, batch, kv) if rows is None else None
        for i, layer in enumerate(self._run_layers if stack is None else ()):
            ops, x = self._move(ops, self.layer_ops[i], x)
            views = prepared.get(id(ops))
            if views is None:
                b = ops.prepare_batch(batch)
                views = prepared[id(ops)] = (b, b.window_view())  # global, sliding-window layers
            x = self._layer(ops, layer, x, views[layer.window > 0], kv[i], rows if i == last else None,
                            self._step_args[i])
        if stack is not None:
            ops, x = stack
        ops, x = self._move(ops, self.output_ops, x)
        hidden = None
        if want_hidden:  # x holds the `keep` rows, sorted: pick the hidden ones, then the logits'
            x = ops.rms_norm(x, self._run_output_norm, self.hparams.eps)
            hidden = ops.to_host(ops.take_rows(x, np.searchsorted(keep, hidden_rows).astype(np.int32)))
            if idx.shape[0] == 0:
                return np.empty((0, self.vocab_size), dtype=np.float32), hidden
            if not np.array_equal(keep, idx):
                x = ops.take_rows(x, np.searchsorted(keep, idx).astype(np.int32))
        else:
            if x.shape[0] == 0:
                return np.empty((0, self.vocab_size), dtype=np.float32), None
            x = ops.rms_norm(x, self._run_output_norm, self.hparams.eps)
        logits = ops.matmul(self._run_output, x)  # [n_out, vocab]
        if self.final_softcap:
            logits = ops.softcap(logits, self.final_softcap)
        return ops.to_host(logits), hidden

    @staticmethod
    def _move(src, dst, x):
        """(dst, x in dst's memory): one copy across a backend boundary, nothing otherwise."""
        if dst is src:
            return src, x
        return dst, dst.upload(src.to_host(x))

    # --- one block -------------------------------------------------------------------------------
    def _layer(self, ops, lw: LayerWeights, x, batch: Batch, kv: LayerKV, rows, step_args):
        step_fn = getattr(ops, "attention_block_step", None) if rows is None else None
        step = None if step_fn is None else step_fn(x, *step_args[:4], kv, batch, *step_args[4:])
        if step is None:
            x, h = self._attention_block(ops, lw, x, batch, kv, rows)
            if h is None:  # a pure prefill chunk: the KV is written, no logits are wanted
                return x
        else:
            x, h = step
            if h is None:  # the backend ran the FFN (or MoE) block and its residual add in the same call
                return x
        f = self._ffn(ops, lw.ffn, h) if lw.moe is None else moe_ffn(ops, lw.moe, h, self.ffn_act)
        if lw.post_ffn_norm is not None:
            f = ops.rms_norm(f, lw.post_ffn_norm, self.hparams.eps)
        x = ops.add(x, f, out=x)
        return x

    def _layers_step(self, x, batch: Batch, kv: list[LayerKV]):
        """(ops, x through every layer) from one layers_step call where all layers sit on one
        backend that has that op and it applies (a decode step of dense layers), else None."""
        ops = self.layer_ops[0]
        step_fn = getattr(ops, "layers_step", None)
        if step_fn is None or ops is not self.host_ops or any(o is not ops for o in self.layer_ops):
            return None
        y = step_fn(x, self._step_args, kv, ops.prepare_batch(batch))
        return None if y is None else (ops, y)

    def _attention_step_args(self, lw: LayerWeights) -> tuple:
        """Layer lw's arguments to a backend's attention_block_step but x, kv and batch (which go
        after the first four), with its MoE block's or dense FFN's where the call may run it too."""
        a = lw.attn
        mats = (a.wqkv,) if a.wqkv is not None else ((a.wqk, a.wv) if a.wqk is not None else (a.wq, a.wk, a.wv))
        moe = block_step_args(lw.moe, self.ffn_act) if lw.moe is not None and lw.post_ffn_norm is None else None
        f = lw.ffn
        ffn = (f.gate, f.up, f.down, self.ffn_act, lw.post_ffn_norm) if f is not None and lw.moe is None else None
        return (lw.attn_norm, mats, a.wo, lw.ffn_norm, lw.rope, self.hparams.eps, self.attn_scale, lw.window,
                self.attn_softcap, a.q_norm, a.k_norm, None if a.bq is None else (a.bq, a.bk, a.bv), a.bo, a.sinks,
                lw.post_attn_norm, moe, ffn)

    def _attention_block(self, ops, lw: LayerWeights, x, batch: Batch, kv: LayerKV, rows):
        """The general path: (x + the attention block's output, rms_norm of it by ffn_norm), x and
        h cut to `rows` where given; h None when no row is wanted."""
        eps = self.hparams.eps
        h = ops.rms_norm(x, lw.attn_norm, eps)
        o = self._attention(ops, lw, h, batch, kv)  # [n, n_heads, head_dim]
        n = o.shape[0]
        if rows is not None:  # only these rows matter from here on (logits of the last layer)
            o, x = ops.take_rows(o, rows), ops.take_rows(x, rows)
            n = o.shape[0]
            if n == 0:
                return x, None
        o = ops.matmul(lw.attn.wo, o.reshape(n, o.shape[1] * o.shape[2]))  # [n, n_embd]
        if lw.attn.bo is not None:
            o = ops.add(o, lw.attn.bo, out=o)
        if lw.post_attn_norm is not None:
            o = ops.rms_norm(o, lw.post_attn_norm, eps)
        x = ops.add(x, o, out=x)
        return x, ops.rms_norm(x, lw.ffn_norm, eps)

    def _attention(self, ops, lw: LayerWeights, h, batch: Batch, kv: LayerKV):
        hp = self.hparams
        a = lw.attn
        n = h.shape[0]
        hd, nh, nkv = hp.head_dim, hp.n_heads, hp.n_kv_heads
        if a.wqkv is not None:
            qkv = ops.matmul(a.wqkv, h)  # [n, (nh + 2*nkv)*hd]
            q = ops.slice_cols(qkv, 0, nh * hd)
            k = ops.slice_cols(qkv, nh * hd, (nh + nkv) * hd)
            v = ops.slice_cols(qkv, (nh + nkv) * hd, (nh + 2 * nkv) * hd)
        elif a.wqk is not None:
            qk, v = matmuls(ops, (a.wqk, a.wv), h)  # [n, (nh + nkv)*hd], [n, nkv*hd]
            q = ops.slice_cols(qk, 0, nh * hd)
            k = ops.slice_cols(qk, nh * hd, (nh + nkv) * hd)
        else:
            q, k, v = matmuls(ops, (a.wq, a.wk, a.wv), h)  # [n, nh*hd], [n, nkv*hd] x 2
        if a.bq is not None:
            q = ops.add(q, a.bq, out=q)
            k = ops.add(k, a.bk, out=k)
            v = ops.add(v, a.bv, out=v)
        q = _rope_store(ops, q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd), kv, batch,
                        lw.rope, hp.eps, a.q_norm, a.k_norm)  # [n, nh, hd]
        if a.sinks is not None:
            return ops.attention(q, kv, batch, self.attn_scale, lw.window, self.attn_softcap, sinks=a.sinks)
        return ops.attention(q, kv, batch, self.attn_scale, lw.window, self.attn_softcap)

    def _ffn(self, ops, f: FeedForwardWeights, h):
        return gated_ffn(ops, f, h, self.ffn_act)  # [n, n_embd]


def _rope_store(ops, q, k, v, kv: LayerKV, batch: Batch, rope: RopeParams, eps: float, q_norm, k_norm):
    """q [n, h, hd] and k [n, kvh, hd] through their per-head norms (where the model has them) and
    RoPE, k and v [n, kvh, hd] stored in kv; returns q. One call on a backend with the fused
    rope_store_kv (the CPU's), else the three ops it stands for."""
    fused = getattr(ops, "rope_store_kv", None)
    if fused is not None:
        return fused(q, k, v, kv, batch.positions, batch.slot_mapping, rope, eps, q_norm, k_norm)
    return rope_store_kv_by_ops(ops, q, k, v, kv, batch.positions, batch.slot_mapping, rope, eps, q_norm, k_norm)


def layer_matrices(lw: LayerWeights):
    """(name, QTensor) of every matrix layer `lw` multiplies by (stacked experts as one each)."""
    ffn = lw.ffn
    for w in (lw.attn.wq, lw.attn.wk, lw.attn.wv, lw.attn.wqkv, lw.attn.wqk, lw.attn.wo,
              *((ffn.gate, ffn.up, ffn.down) if ffn is not None else ())):
        if w is not None:
            yield w.name, w
    if lw.moe is not None:
        yield from lw.moe.matrices()


def unsupported_matrix(ops, matrices) -> str:
    """Why backend `ops` cannot multiply by one of `matrices` ((name, QTensor) pairs), "" if it can:
    asks `check_supported(qtype)` of the backend, or of the module defining its matmul."""
    import sys

    check = getattr(ops, "check_supported", None)
    if check is None:
        check = getattr(sys.modules.get(getattr(ops.matmul, "__module__", "")), "check_supported", None)
    if check is None:
        return ""
    for name, w in matrices:
        try:
            check(w.qtype)
        except ValueError as e:
            return f"tensor {name!r}: {e}"
    return ""


def _nbytes(w) -> int:
    """Bytes of a QTensor, array, or dataclass of them (RoPE tables are not weights)."""
    if isinstance(w, QTensor):
        return int(w.data.nbytes)
    if isinstance(w, np.ndarray):
        return int(w.nbytes)
    if is_dataclass(w) and not isinstance(w, RopeParams):
        return sum(_nbytes(getattr(w, f.name)) for f in fields(w))
    return 0


def _concat_rows(ws, name: str) -> QTensor:
    """One QTensor whose rows are those of `ws` in order (one type, one width): GGUF rows are
    independent, so each output row of a matmul by it keeps its bits."""
    rows = sum(w.shape[0] for w in ws)
    return QTensor(name, ws[0].qtype, (rows, ws[0].shape[1]), np.concatenate([w.rows().reshape(-1) for w in ws]))


def _fused(ops, lw: LayerWeights, host_ops) -> LayerWeights:
    """lw with q|k|v and gate|up each concatenated into one matrix where their types match and
    backend `ops` fuses them (host: fuses_rows; a device always, its upload copies anyway): one
    matmul call and one activation quantization instead of three (two); q|k alone where only v's
    type differs."""
    fuses = getattr(ops, "fuses_rows", None) if ops is host_ops else (lambda qtype: True)
    if fuses is None:
        return lw
    a, f = lw.attn, lw.ffn
    if a.wq is not None and a.wq.qtype == a.wk.qtype and fuses(a.wq.qtype):
        if a.wv.qtype == a.wq.qtype:
            name = a.wq.name.replace("attn_q", "attn_qkv", 1)
            a = replace(a, wq=None, wk=None, wv=None, wqkv=_concat_rows([a.wq, a.wk, a.wv], name))
        else:
            a = replace(a, wq=None, wk=None, wqk=_concat_rows([a.wq, a.wk], a.wq.name.replace("attn_q", "attn_qk", 1)))
    if f is not None and f.gate is not None and f.gate.qtype == f.up.qtype and fuses(f.gate.qtype):
        f = replace(f, gate=None, up=_concat_rows([f.gate, f.up], f.gate.name.replace("ffn_gate", "ffn_gate_up", 1)))
    return lw if (a is lw.attn and f is lw.ffn) else replace(lw, attn=a, ffn=f)


def _placed(ops, w, host_ops):
    """w (a QTensor, a float32 array, or a dataclass of them) in the memory of backend `ops`. On
    the host only weights change: into the layout its matmul reads fastest (upload_matrix)."""
    if w is None:
        return w
    on_host = ops is host_ops
    if isinstance(w, QTensor):
        if len(w.shape) == 3 and not on_host:  # stacked experts [n_expert, rows, cols]: one matrix per expert
            return tuple(ops.upload_matrix(s) for s in w.slabs())
        up = getattr(ops, "upload_matrix", None) if on_host else ops.upload_matrix
        return up(w) if up is not None else w
    if isinstance(w, np.ndarray):
        return w if on_host else ops.upload(w)
    if is_dataclass(w) and not isinstance(w, RopeParams):
        host = getattr(w, "HOST_FIELDS", ())  # read on the host (MoE routing): not uploaded
        return type(w)(**{f.name: (getattr(w, f.name) if f.name in host
                                   else _placed(ops, getattr(w, f.name), host_ops)) for f in fields(w)})
    return w


def attention_weights(ts, prefix: str, hp: HParams, *, fused: bool = False, biases: bool = False,
                      qk_norm: bool = False, out_bias: bool = False, sinks: bool = False) -> AttentionWeights:
    """Look up `<prefix>.attn_*` tensors with the shapes `hp` implies (ModelError otherwise):
    q/k/v biases, q/k norms, the output bias and the sinks (attn_sinks.weight) where asked for."""
    e, hd, nh, nkv = hp.n_embd, hp.head_dim, hp.n_heads, hp.n_kv_heads
    a = AttentionWeights(wo=ts.get(f"{prefix}.attn_output.weight", (e, nh * hd)))
    if fused and ts.has(f"{prefix}.attn_qkv.weight"):
        a.wqkv = ts.get(f"{prefix}.attn_qkv.weight", ((nh + 2 * nkv) * hd, e))
    else:
        a.wq = ts.get(f"{prefix}.attn_q.weight", (nh * hd, e))
        a.wk = ts.get(f"{prefix}.attn_k.weight", (nkv * hd, e))
        a.wv = ts.get(f"{prefix}.attn_v.weight", (nkv * hd, e))
    if biases:
        a.bq = ts.vector(f"{prefix}.attn_q.bias", nh * hd)
        a.bk = ts.vector(f"{prefix}.attn_k.bias", nkv * hd)
        a.bv = ts.vector(f"{prefix}.attn_v.bias", nkv * hd)
    if qk_norm:
        a.q_norm = ts.vector(f"{prefix}.attn_q_norm.weight", hd)
        a.k_norm = ts.vector(f"{prefix}.attn_k_norm.weight", hd)
    if out_bias:
        a.bo = ts.vector(f"{prefix}.attn_output.bias", e)
    if sinks:
        a.sinks = ts.vector(f"{prefix}.attn_sinks.weight", nh)
    return a


def ffn_weights(ts, prefix: str, hp: HParams, *, fused_gate_up: bool = False) -> FeedForwardWeights:
    """Look up `<prefix>.ffn_*` tensors (gate/up separate, or fused gate|up in ffn_up)."""
    e, ff = hp.n_embd, hp.n_ff
    down = ts.get(f"{prefix}.ffn_down.weight", (e, ff))
    if fused_gate_up and not ts.has(f"{prefix}.ffn_gate.weight"):
        return FeedForwardWeights(up=ts.get(f"{prefix}.ffn_up.weight", (2 * ff, e)), down=down)
    return FeedForwardWeights(
        up=ts.get(f"{prefix}.ffn_up.weight", (ff, e)),
        down=down,
        gate=ts.get(f"{prefix}.ffn_gate.weight", (ff, e)),
    )


def embeddings_and_output(ts, hp: HParams):
    """token_embd [vocab, n_embd], output_norm [n_embd] and output (token_embd when tied)."""
    tok = ts.get("token_embd.weight", (hp.vocab_size, hp.n_embd))
    norm = ts.vector("output_norm.weight", hp.n_embd)
    out = ts.optional("output.weight", (hp.vocab_size, hp.n_embd))
    return tok, norm, (tok if out is None else out)


def vocab_rows(ts) -> int:
    """Vocabulary size = rows of token_embd.weight (ModelError if the tensor is missing or not 2-D)."""
    qt = ts.tensors.get("token_embd.weight")
    if qt is None or len(qt.shape) != 2:
        shape = None if qt is None else tuple(qt.shape)
        raise ModelError(f"{ts.path}: tensor 'token_embd.weight' must exist with shape (vocab, n_embd); "
                         f"found {shape}")
    return int(qt.shape[0])

