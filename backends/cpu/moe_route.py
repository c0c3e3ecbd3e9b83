"""moe_route: a mixture-of-experts layer's routing on the host in one compiled call: each token's
top-k experts and combine weights (models/moe.py's gating modes), and the (token, rank) pairs
grouped by expert. At decode this replaced some 25 small numpy calls per layer.

Per token, in float32 as ggml: "softmax" probs = exp(l - max) / sum; "sigmoid" 1 / (1 + exp(-l));
"softmax_topk" probs = l, the chosen ones' softmax afterwards. The top k of probs + probs_b go in
rank order, ties (and NaN, ranked as -inf) to the lower expert id; norm_topk divides the k weights
by max(their sum, 6.1e-5). Each token is routed alone, so its result does not depend on the batch.
"""

import math

import numba as nb
import numpy as np

GATING_CODES = {"softmax": 0, "softmax_topk": 1, "sigmoid": 2}
_NORM_MIN = np.float32(6.103515625e-5)  # llama.cpp clamps the chosen weights' sum here (float16's smallest normal)
_NONE = np.zeros(0, np.float32)  # "no bias"


def bias_array(b) -> np.ndarray:
    """A gating bias as the kernel takes it: float32 [n_expert], or _NONE for None."""
    return _NONE if b is None else np.ascontiguousarray(b, dtype=np.float32)


@nb.njit(cache=True, nogil=True)
def _softmax_inplace(v):
    n = v.shape[0]
    m = v[0]
    for i in range(1, n):
        m = max(m, v[i])
    s = np.float32(0.0)
    for i in range(n):
        v[i] = np.float32(math.exp(v[i] - m))
        s += v[i]
    for i in range(n):
        v[i] = v[i] / s


@nb.njit(cache=True, nogil=True)
def _route_groups(logits, k, gating, norm_topk, scale, gate_b, probs_b):
    n, E = logits.shape
    chosen = np.empty((n, k), np.int64)
    w = np.empty((n, k), np.float32)
    probs = np.empty(E, np.float32)
    score = np.empty(E, np.float32)
    taken = np.empty(E, np.bool_)
    top = np.empty(k, np.float32)
    for t in range(n):
        for e in range(E):
            probs[e] = logits[t, e] + gate_b[e] if gate_b.shape[0] else logits[t, e]
        if gating == 0:
            _softmax_inplace(probs)
        elif gating == 2:
            for e in range(E):
                probs[e] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-probs[e])))
        for e in range(E):
            s = probs[e] + probs_b[e] if probs_b.shape[0] else probs[e]
            score[e] = s if s == s else -np.inf
            taken[e] = False
        for r in range(k):
            best = -1
            for e in range(E):
                if not taken[e] and (best < 0 or score[e] > score[best]):
                    best = e
            taken[best] = True
            chosen[t, r] = best
            top[r] = probs[best]
        if gating == 1:
            _softmax_inplace(top)
        if norm_topk:
            s = np.float32(0.0)
            for r in range(k):
                s += top[r]
            s = max(s, _NORM_MIN)
            for r in range(k):
                top[r] = top[r] / s
        for r in range(k):
            w[t, r] = top[r] * scale if scale != 1.0 else top[r]
    # group the pairs p = t*k + r by expert (a counting sort: stable, tokens ascending within a group)
    count = np.zeros(E + 1, np.int64)
    for p in range(n * k):
        count[chosen.flat[p] + 1] += 1
    n_groups = 0
    for e in range(E):
        n_groups += count[e + 1] > 0
        count[e + 1] += count[e]
    experts = np.empty(n_groups, np.int64)
    cuts = np.empty(n_groups + 1, np.int64)
    g = 0
    for e in range(E):
        if count[e + 1] > count[e]:
            experts[g] = e
            cuts[g] = count[e]
            g += 1
    cuts[n_groups] = n * k
    tokens = np.empty(n * k, np.int32)
    src = np.empty((n, k), np.int32)
    for p in range(n * k):
        e = chosen.flat[p]
        q = count[e]
        count[e] += 1
        tokens[q] = p // k
        src.flat[p] = q
    return chosen, w, tokens, experts, cuts, src


def route_groups(logits: np.ndarray, k: int, gating: str, norm_topk: bool = False, scale: float = 1.0,
                 gate_b: np.ndarray | None = None, probs_b: np.ndarray | None = None):
    """(chosen int64 [n, k], weights float32 [n, k], tokens int32 [P], experts int64 [g], cuts int64
    [g+1], src int32 [n, k]) from router logits float32 [n, E]: P = n·k pairs grouped by expert
    (group i: pairs cuts[i]:cuts[i+1], all routed to experts[i], ascending ids), tokens[q] the
    token of grouped pair q, src[t, r] the grouped position of token t's rank-r pair. gate_b is
    added to the logits, probs_b to the probs for the selection only (float32 [E] each)."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    return _route_groups(logits, int(k), GATING_CODES[gating], bool(norm_topk), np.float32(scale),
                         bias_array(gate_b), bias_array(probs_b))
