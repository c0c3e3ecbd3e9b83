"""moe_ffn_step: a mixture-of-experts layer's routed experts and their weighted sum in one call,
for batches whose expert groups are all small (decode); moe_block_step: the router's matmul and
the routing too, for batches of at most the gemv's tokens (every group is then small).

The general path (models/moe.py) makes four op calls a layer: moe_matmul for gate and up, the
activation, moe_matmul for down, moe_combine. At decode their Python and dispatch cost more than
half of what the experts' arithmetic does on a small model (docs/kernels.md, "The MoE step").
This runs the same compiled kernels in the same order inside one compiled call, so every bit is
the general path's: batch invariance holds whichever path a batch takes.
"""

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.act_quant import quantized_q8
from edged.backends.cpu.activations import _silu_mul_rows, _silu_mul_rows_serial
from edged.backends.cpu.kernel_threads import SERIAL_ELEMENTS
from edged.backends.cpu.matmul import gemv_max_n
from edged.backends.cpu.matmul_float import matmul_f32
from edged.backends.cpu.matmul_kquants import QK_K, kind_of
from edged.backends.cpu.moe_combine import _combine_rows, _combine_rows_serial
from edged.backends.cpu.moe_matmul import _GROUP_ERRORS, _check_weights, _experts_gemv, _prepare, _small_groups
from edged.backends.cpu.moe_route import GATING_CODES, _route_groups, bias_array
from edged.quant.tensor import QTensor

ACTIVATIONS = ("silu",)  # the gated activations this path computes (models/ffn.py names)


@nb.njit(cache=True, nogil=True)
def _step(wg, wu, wd, pg, pu, pd, kind_gu, kind_d, h, tokens, experts, cuts, src, weights, n_expert, max_n, out):
    """out float32 [n, d] = sum over token t's ranks j of weights[t, j] * down(silu(gate(h_t)) * up(h_t))
    of expert experts[g] for t's rank-j pair src[t, j] (grouped as moe_matmul's); wg / wu / wd the
    stacked experts' rows (uint8 [n_expert * rows, row_bytes], pg / pu / pd: in the pair layout).
    Returns 0, a _GROUP_ERRORS code, 4 when a group is larger than max_n, 5 for a bad src."""
    P = tokens.shape[0]
    m_ff = wg.shape[0] // n_expert
    d = out.shape[1]
    err, small, n_small = _small_groups(tokens, experts, cuts, h.shape[0], n_expert, max_n)
    if err:
        return err
    if n_small != experts.shape[0] - np.sum(cuts[1:] == cuts[:-1]):
        return 4
    for t in range(src.shape[0]):
        for j in range(src.shape[1]):
            if src[t, j] < 0 or src[t, j] >= P:
                return 5
    xg, xa, xb = _prepare(*quantized_q8(h), tokens, kind_gu)
    gate = np.empty((P, m_ff), np.float32)  # [P, n_ff_exp]
    up = np.empty((P, m_ff), np.float32)  # [P, n_ff_exp]
    _experts_gemv(wg, wu, 2, m_ff, xg, xa, xb, experts, cuts, small, gate, up, kind_gu, False, h.shape[1] // QK_K,
                  0, pg, pu)
    act = np.empty((P, m_ff), np.float32)  # [P, n_ff_exp]
    if act.size <= SERIAL_ELEMENTS:
        _silu_mul_rows_serial(gate, 0, up, 0, act)
    else:
        _silu_mul_rows(gate, 0, up, 0, act)
    ag, aa, ab = _prepare(*quantized_q8(act), np.arange(P).astype(np.int32), kind_d)
    y = np.empty((P, d), np.float32)  # [P, n_embd], grouped pair order
    _experts_gemv(wd, wd, 1, d, ag, aa, ab, experts, cuts, small, y, y, kind_d, False, m_ff // QK_K, 0, pd, pd)
    if out.size <= SERIAL_ELEMENTS:
        _combine_rows_serial(y, src, weights, out)
    else:
        _combine_rows(y, src, weights, out)
    return 0


@nb.njit(cache=True, nogil=True)
def _block(router, k_used, gating, norm_topk, scale, gate_b, probs_b, wg, wu, wd, pg, pu, pd, kind_gu, kind_d, h,
           n_expert, max_n, out):
    """_step after the router's logits (matmul's own F32 kernel over router uint8 [n_expert, 4·n_embd])
    and moe_route's gating of them."""
    logits = np.empty((h.shape[0], n_expert), np.float32)  # [n, n_expert]
    matmul_f32(router, h, logits, 0, 0, 0, 0)
    _, weights, tokens, experts, cuts, src = _route_groups(logits, k_used, gating, norm_topk, scale, gate_b, probs_b)
    return _step(wg, wu, wd, pg, pu, pd, kind_gu, kind_d, h, tokens, experts, cuts, src, weights, n_expert, max_n,
                 out)


def _experts_fit(gate, up, down, act) -> bool:
    """Whether the experts' types and activation are this path's (else the caller's general path)."""
    if act not in ACTIVATIONS or not all(isinstance(w, QTensor) and kind_of(w) is not None for w in (gate, up, down)):
        return False
    return gate.qtype == up.qtype and kind_of(gate) == kind_of(up)  # one kind runs both


def _checked(gate, up, down, h) -> np.ndarray:
    """h as float32 C-contiguous [n, n_embd], the three stacks checked to fit it and each other."""
    x = np.ascontiguousarray(h, dtype=np.float32)
    _check_weights((gate, up), x)
    n_expert, m_ff, _ = gate.shape
    if len(down.shape) != 3 or down.shape[:2] != (n_expert, x.shape[1]) or down.shape[2] != m_ff:
        raise ValueError(f"moe step: down {down.shape} does not fit gate {gate.shape}")
    return x


def _max_n(gate, down) -> int:
    return min(gemv_max_n(gate.qtype), gemv_max_n(down.qtype))


def block_args(router: QTensor, k: int, gating: str, norm_topk: bool, scale: float, gate_b, probs_b,
               gate: QTensor, up: QTensor, down: QTensor, x: np.ndarray, act: str):
    """(before h, after h): _block's arguments around h for the float32 batch x [n, n_embd] (h's
    shape), or None where moe_block_step does not apply (see there); ValueError for shapes that
    do not fit."""
    if not (isinstance(router, QTensor) and router.qtype == T.F32 and not router.grouped
            and _experts_fit(gate, up, down, act)):
        return None
    _checked(gate, up, down, x)
    n_expert = gate.shape[0]
    max_n = _max_n(gate, down)
    if x.shape[0] > max_n:
        return None
    if router.shape != (n_expert, x.shape[1]) or not 1 <= k <= n_expert:
        raise ValueError(f"moe_block_step: router {router.shape} and k = {k} do not fit {n_expert} experts "
                         f"and n_embd {x.shape[1]}")
    return ((router.rows(), int(k), GATING_CODES[gating], bool(norm_topk), np.float32(scale), bias_array(gate_b),
             bias_array(probs_b), gate.rows(), up.rows(), down.rows(), gate.grouped, up.grouped, down.grouped,
             kind_of(gate), kind_of(down)), (n_expert, max_n))


def moe_block_step(router: QTensor, k: int, gating: str, norm_topk: bool, scale: float, gate_b, probs_b,
                   gate: QTensor, up: QTensor, down: QTensor, h: np.ndarray, act: str) -> np.ndarray | None:
    """The routed block of h [n, n_embd] -> float32 [n, n_embd]: router logits h @ router.T (an F32
    router [n_expert, n_embd], through matmul's kernel), moe_route's gating (k experts a token;
    gate_b, probs_b float32 [n_expert] or None) and moe_ffn_step's experts and sum, in one call.
    None for more tokens than the gemv's batch, another router type, or experts moe_ffn_step does
    not take: the caller runs the general path, which gives the same bits."""
    x = np.ascontiguousarray(h, dtype=np.float32)
    args = block_args(router, k, gating, norm_topk, scale, gate_b, probs_b, gate, up, down, x, act)
    if args is None:
        return None
    out = np.empty(x.shape, np.float32)  # [n, n_embd]
    err = _block(*args[0], x, *args[1], out)
    if err:  # cannot happen: n <= max_n makes every group small, and the routing forms them well
        raise RuntimeError(f"moe_block_step: the routing's groups were refused (code {err})")
    return out


def moe_ffn_step(gate: QTensor, up: QTensor, down: QTensor, h: np.ndarray, tokens: np.ndarray, experts: np.ndarray,
                 cuts: np.ndarray, src: np.ndarray, weights: np.ndarray, act: str) -> np.ndarray | None:
    """moe_combine([down(act(gate(h), up(h)))], src, weights) over the grouped pairs (moe_matmul's
    tokens, experts, cuts; src int32 [n, k] and weights float32 [n, k] as moe_route gives them):
    float32 [n, n_embd]. None where this path does not apply (another activation or weight type,
    or a group past the gemv's batch): the caller runs the general path, which gives the same bits."""
    if not _experts_fit(gate, up, down, act):
        return None
    x = _checked(gate, up, down, h)
    n_expert = gate.shape[0]
    src = np.ascontiguousarray(src, dtype=np.int32)
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    if src.ndim != 2 or src.shape[0] != x.shape[0] or weights.shape != src.shape:
        raise ValueError(f"moe_ffn_step: src {src.shape} and weights {weights.shape} must be [{x.shape[0]}, k]")
    out = np.empty((x.shape[0], x.shape[1]), np.float32)  # [n, n_embd]
    err = _step(gate.rows(), up.rows(), down.rows(), gate.grouped, up.grouped, down.grouped, kind_of(gate),
                kind_of(down), x, np.ascontiguousarray(tokens, dtype=np.int32),
                np.ascontiguousarray(experts, dtype=np.int64), np.ascontiguousarray(cuts, dtype=np.int64), src,
                weights, n_expert, _max_n(gate, down), out)
    if err == 4:
        return None
    if err == 5:
        raise ValueError(f"moe_ffn_step: src indices must be in [0, {len(tokens)})")
    if err:
        raise ValueError("moe_ffn_step: " + _GROUP_ERRORS[err].format(e=n_expert, n=x.shape[0]))
    return out
