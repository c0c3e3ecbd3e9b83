"""The mixture-of-experts feed-forward block (llama.cpp's build_moe_ffn), shared by the MoE
architectures.

Per token, router logits = h @ gate_inp (+ gate_inp_b), then `gating` picks n_expert_used experts
and their weights:
    "softmax"       probs = softmax over all experts; the top-k of probs (+ exp_probs_b); weights =
                    the chosen probs (qwen3moe, mixtral)
    "softmax_topk"  the top-k of the logits (+ exp_probs_b); weights = softmax over the chosen
                    logits (gpt-oss)
    "sigmoid"       probs = sigmoid(logits); the top-k of probs + exp_probs_b; weights = the chosen
                    probs (deepseek v3: exp_probs_b moves the selection, never the weights)
optionally renormalised to sum 1 (norm_topk; the sum clamped at 6.1e-5 as llama.cpp does) and
scaled (weights_scale). Ties go to the lower expert id. Each chosen expert e runs a gated FFN,
    y_e = down_e(act(gate_e(h) + bg_e, up_e(h) + bu_e)) + bd_e     (act from models/ffn.py's table)
and out = sum over the token's ranks r of weights[r] * y_{e_r}, plus the shared expert's output
(times sigmoid(h . shared_gate) where the file has that gate).

Execution: the routing runs on the host in one compiled call per layer (backends/cpu/moe_route.py),
which also groups the tokens by expert (a stable counting sort), so each chosen expert's matrices
are read once per step for all its tokens (a matmul of the gathered rows against the expert's 2-D
slab of the stacked GGUF tensor; on a backend with ops.moe_matmul, every expert's gate and up in
one call and then every down in another, with the same rows); ops.moe_combine then sums each
token's rows in its own rank order. Every matmul is batch invariant per row, so a token's result
is bit-identical alone or in any batch.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.moe_route import GATING_CODES, route_groups
from edged.models.errors import ModelError
from edged.models.ffn import GATED_ACTIVATIONS, gated_ffn
from edged.models.tensors import VECTOR_LIMIT, as_f32_vector
from edged.quant.tensor import QTensor

GATINGS = tuple(GATING_CODES)
# ops a backend needs beyond a dense layer's to run a MoE layer (placement checks for them)
REQUIRED_OPS = ("moe_combine",)


@dataclass
class MoEWeights:
    """One layer's experts, router and gating configuration. The stacked expert tensors are the
    file's 3-D QTensors on the host; placed on another backend, tuples of per-expert matrices."""

    gate_inp: QTensor  # router [n_expert, n_embd]
    up_exps: QTensor  # [n_expert, n_ff_exp, n_embd]; [n_expert, 2*n_ff_exp, n_embd] rows gate|up when gate_exps is None
    down_exps: QTensor  # [n_expert, n_embd, n_ff_exp]
    n_expert_used: int  # k: experts per token
    gate_exps: QTensor | None = None  # [n_expert, n_ff_exp, n_embd]
    gating: str = "softmax"  # one of GATINGS
    norm_topk: bool = False  # renormalise the k chosen weights to sum 1
    weights_scale: float = 1.0  # multiplies the final weights
    gate_inp_b: np.ndarray | None = None  # float32 [n_expert]: added to the router logits (gpt-oss)
    exp_probs_b: np.ndarray | None = None  # float32 [n_expert]: added for the selection only (deepseek v3)
    gate_exps_b: np.ndarray | None = None  # float32 [n_expert, n_ff_exp]
    up_exps_b: np.ndarray | None = None  # float32 [n_expert, n_ff_exp] ([n_expert, 2*n_ff_exp] when fused)
    down_exps_b: np.ndarray | None = None  # float32 [n_expert, n_embd]
    shared: object = None  # FeedForwardWeights (models/decoder.py) of a shared expert every token runs
    shared_gate: QTensor | None = None  # [1, n_embd]: the shared expert's output times sigmoid(h . w)

    # read by the routing on the host: placement leaves them there
    HOST_FIELDS: ClassVar[tuple] = ("gate_inp_b", "exp_probs_b")

    def __post_init__(self):
        if self.gating not in GATINGS:
            raise ModelError(f"unknown expert gating {self.gating!r}; known: {', '.join(GATINGS)}")
        if not 1 <= self.n_expert_used <= self.n_expert:
            raise ModelError(f"{self.n_expert_used} experts per token: must be in [1, {self.n_expert}]")

    @property
    def n_expert(self) -> int:
        return int(self.gate_inp.shape[0])

    def matrices(self):
        """(name, QTensor) of every matrix the block multiplies by (stacked experts as one each)."""
        for w in (self.gate_inp, self.gate_exps, self.up_exps, self.down_exps, self.shared_gate):
            if w is not None:
                yield w.name, w
        if self.shared is not None:
            for w in (self.shared.gate, self.shared.up, self.shared.down):
                if w is not None:
                    yield w.name, w


def missing_ops(ops) -> list[str]:
    """The ops of REQUIRED_OPS that backend `ops` lacks."""
    return [name for name in REQUIRED_OPS if not hasattr(ops, name)]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for x < -88: the sigmoid is 0, as it should be
        return (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32)


def _routed(mw: MoEWeights, logits: np.ndarray):
    """route_groups (backends/cpu/moe_route.py) for this layer's gating."""
    return route_groups(logits, mw.n_expert_used, mw.gating, mw.norm_topk, mw.weights_scale,
                        mw.gate_inp_b, mw.exp_probs_b)


def route(mw: MoEWeights, logits: np.ndarray):
    """(chosen int64 [n, k], weights float32 [n, k]) from router logits float32 [n, n_expert]:
    each token's experts in rank order (ties to the lower id) and their combine weights."""
    return _routed(mw, logits)[:2]


def _has_biases(mw: MoEWeights) -> bool:
    return mw.gate_exps_b is not None or mw.up_exps_b is not None or mw.down_exps_b is not None


def _per_expert(w):
    """Indexable by expert id: a host QTensor's slabs, or the tuple placement made."""
    return w.slabs() if isinstance(w, QTensor) else w


def _expert_ffn(ops, mw: MoEWeights, gates, ups, downs, e: int, x, act):
    """Expert e's gated FFN of x [m, n_embd] -> [m, n_embd]."""
    if gates is None:  # fused gate|up rows
        gu = ops.matmul(ups[e], x)  # [m, 2*n_ff_exp]
        if mw.up_exps_b is not None:
            gu = ops.add(gu, mw.up_exps_b[e], out=gu)
        half = gu.shape[1] // 2
        gate, up = ops.slice_cols(gu, 0, half), ops.slice_cols(gu, half, 2 * half)
    else:
        gate = ops.matmul(gates[e], x)  # [m, n_ff_exp]
        up = ops.matmul(ups[e], x)  # [m, n_ff_exp]
        if mw.gate_exps_b is not None:
            gate = ops.add(gate, mw.gate_exps_b[e], out=gate)
        if mw.up_exps_b is not None:
            up = ops.add(up, mw.up_exps_b[e], out=up)
    y = ops.matmul(downs[e], act(ops, gate, up))  # [m, n_embd]
    if mw.down_exps_b is not None:
        y = ops.add(y, mw.down_exps_b[e], out=y)
    return y


def _experts_ffn(ops, mw: MoEWeights, h, tokens, experts, cuts, act):
    """Every pair's expert FFN through ops.moe_matmul (gate and up in one call, then down) ->
    [P, n_embd] in the grouped pair order; the same rows _expert_ffn gives group by group."""
    by_expert = np.repeat(experts, np.diff(cuts)) if _has_biases(mw) else None  # [P] each pair's expert
    if mw.gate_exps is None:  # fused gate|up rows
        gu, = ops.moe_matmul((mw.up_exps,), h, tokens, experts, cuts)  # [P, 2*n_ff_exp]
        if mw.up_exps_b is not None:
            gu = ops.add(gu, mw.up_exps_b[by_expert], out=gu)
        half = gu.shape[1] // 2
        gate, up = ops.slice_cols(gu, 0, half), ops.slice_cols(gu, half, 2 * half)
    else:
        gate, up = ops.moe_matmul((mw.gate_exps, mw.up_exps), h, tokens, experts, cuts)  # [P, n_ff_exp] each
        if mw.gate_exps_b is not None:
            gate = ops.add(gate, mw.gate_exps_b[by_expert], out=gate)
        if mw.up_exps_b is not None:
            up = ops.add(up, mw.up_exps_b[by_expert], out=up)
    a = act(ops, gate, up)  # [P, n_ff_exp]
    y, = ops.moe_matmul((mw.down_exps,), a, np.arange(a.shape[0], dtype=np.int32), experts, cuts)  # [P, n_embd]
    if mw.down_exps_b is not None:
        y = ops.add(y, mw.down_exps_b[by_expert], out=y)
    return y


def _steps_fused(mw: MoEWeights) -> bool:
    """Whether a backend's moe_block_step / moe_ffn_step may run this layer: host-stacked separate
    gate and up, no biases and no shared expert (they return None for batches or types they do not
    take)."""
    return (isinstance(mw.up_exps, QTensor) and isinstance(mw.gate_exps, QTensor) and mw.shared is None
            and not _has_biases(mw))


def block_step_args(mw: MoEWeights, act: str) -> tuple | None:
    """A backend's moe_block_step arguments but h (router, k, gating, norm_topk, scale, gate_b,
    probs_b, gate, up, down, act), or None where this layer may not take it (_steps_fused)."""
    if not _steps_fused(mw):
        return None
    return (mw.gate_inp, mw.n_expert_used, mw.gating, mw.norm_topk, mw.weights_scale, mw.gate_inp_b, mw.exp_probs_b,
            mw.gate_exps, mw.up_exps, mw.down_exps, act)


def moe_ffn(ops, mw: MoEWeights, h, act: str):
    """The MoE block of h [n, n_embd] (the ffn-normed hidden states) -> [n, n_embd]; `act` names
    a models/ffn.py GATED_ACTIVATIONS entry."""
    n = h.shape[0]
    if n == 0:
        return h
    act_fn = GATED_ACTIVATIONS[act]
    step = block_step_args(mw, act)
    fused = step is not None
    if fused and hasattr(ops, "moe_block_step"):  # a decode step's whole routed block in one call (CPU)
        out = ops.moe_block_step(*step[:10], h, act)
        if out is not None:
            return out
    logits = ops.to_host(ops.matmul(mw.gate_inp, h))  # float32 [n, n_expert]
    _, weights, tokens, experts, cuts, src = _routed(mw, logits)  # pairs grouped by expert
    k = weights.shape[1]
    if fused and hasattr(ops, "moe_ffn_step"):  # the experts and their sum in one call where groups are small
        out = ops.moe_ffn_step(mw.gate_exps, mw.up_exps, mw.down_exps, h, tokens, experts, cuts, src, weights, act)
        if out is not None:
            return out
    if hasattr(ops, "moe_matmul") and isinstance(mw.up_exps, QTensor):  # every expert in one call (CPU)
        ys = [_experts_ffn(ops, mw, h, tokens, experts, cuts, act_fn)]
    else:
        gates = None if mw.gate_exps is None else _per_expert(mw.gate_exps)
        ups, downs = _per_expert(mw.up_exps), _per_expert(mw.down_exps)
        ys = []
        for e, a, b in zip(experts.tolist(), cuts[:-1].tolist(), cuts[1:].tolist()):
            x = h if b - a == n else ops.take_rows(h, tokens[a:b])  # all n tokens: h itself, in order
            ys.append(_expert_ffn(ops, mw, gates, ups, downs, e, x, act_fn))
    if mw.shared is not None:  # one more term per token, after the routed ones (as llama.cpp adds it)
        ys.append(gated_ffn(ops, mw.shared, h, act))
        if mw.shared_gate is not None:
            sw = _sigmoid(ops.to_host(ops.matmul(mw.shared_gate, h)))  # [n, 1]
        else:
            sw = np.ones((n, 1), dtype=np.float32)
        src = np.concatenate([src, np.arange(n * k, n * k + n, dtype=np.int32)[:, None]], axis=1)
        weights = np.concatenate([weights, sw], axis=1)
    return ops.moe_combine(ys, src, weights)


# --- loading ------------------------------------------------------------------------------------
def _float_array(ts, name: str, shape: tuple) -> np.ndarray:
    """A float tensor (biases) as float32 of `shape`, within +-VECTOR_LIMIT like 1-D ones."""
    v = as_f32_vector(ts.get(name, shape), ts.path).reshape(shape)
    if v.size and float(np.abs(v).max()) > VECTOR_LIMIT:
        raise ModelError(f"{ts.path}: tensor {name!r} holds {float(np.abs(v).max()):.4g}: biases must be "
                         f"within +-{VECTOR_LIMIT:g}; the file is damaged")
    return v


def _router(ts, name: str, shape: tuple) -> QTensor:
    """The router matrix; a float one is bounded like a bias (a 3e38 weight made the logits inf)."""
    qt = ts.get(name, shape)
    if qt.qtype in (T.F32, T.F16, T.BF16):
        _float_array(ts, name, shape)
    return qt


def moe_weights(ts, prefix: str, hp, ex, *, gating: str, norm_topk: bool, router_bias: bool = False,
                expert_biases: bool = False, probs_bias: bool = False, n_ff_shared: int = 0) -> MoEWeights:
    """Look up `<prefix>.ffn_*_exps` and the router with the shapes hp (HParams) and ex
    (ExpertHParams) imply; ModelError names a missing or mis-shaped tensor. The flags ask for the
    router bias, per-expert biases, the selection bias (exp_probs_b) and a shared expert of
    n_ff_shared rows (its sigmoid gate ffn_gate_inp_shexp is used when the file has it)."""
    from edged.models.decoder import FeedForwardWeights  # decoder imports this module

    E, e, ff, p = ex.n_expert, hp.n_embd, ex.n_ff_exp, prefix
    gate_inp = _router(ts, f"{p}.ffn_gate_inp.weight", (E, e))
    fused = ts.has(f"{p}.ffn_gate_up_exps.weight") and not ts.has(f"{p}.ffn_gate_exps.weight")
    if fused:
        gate, up = None, ts.get(f"{p}.ffn_gate_up_exps.weight", (E, 2 * ff, e))
    else:
        gate = ts.get(f"{p}.ffn_gate_exps.weight", (E, ff, e))
        up = ts.get(f"{p}.ffn_up_exps.weight", (E, ff, e))
    mw = MoEWeights(gate_inp=gate_inp, up_exps=up, down_exps=ts.get(f"{p}.ffn_down_exps.weight", (E, e, ff)),
                    n_expert_used=ex.n_expert_used, gate_exps=gate, gating=gating, norm_topk=norm_topk,
                    weights_scale=ex.weights_scale)
    if router_bias:
        mw.gate_inp_b = ts.vector(f"{p}.ffn_gate_inp.bias", E)
    if probs_bias:
        mw.exp_probs_b = ts.vector(f"{p}.exp_probs_b.bias", E)
    if expert_biases:
        if fused:
            mw.up_exps_b = _float_array(ts, f"{p}.ffn_gate_up_exps.bias", (E, 2 * ff))
        else:
            mw.gate_exps_b = _float_array(ts, f"{p}.ffn_gate_exps.bias", (E, ff))
            mw.up_exps_b = _float_array(ts, f"{p}.ffn_up_exps.bias", (E, ff))
        mw.down_exps_b = _float_array(ts, f"{p}.ffn_down_exps.bias", (E, e))
    if n_ff_shared:
        mw.shared = FeedForwardWeights(up=ts.get(f"{p}.ffn_up_shexp.weight", (n_ff_shared, e)),
                                       down=ts.get(f"{p}.ffn_down_shexp.weight", (e, n_ff_shared)),
                                       gate=ts.get(f"{p}.ffn_gate_shexp.weight", (n_ff_shared, e)))
        g = ts.optional(f"{p}.ffn_gate_inp_shexp.weight", (e,))
        if g is not None:  # stored 1-D [n_embd]: the same bytes as a 1-row matrix
            mw.shared_gate = QTensor(g.name, g.qtype, (1, e), g.data)
    return mw
