"""attention_block_step: a decode step's whole attention block in one call, from the residual x to
the FFN's input: h = rms_norm(x), q|k|v = h @ W (one quantization of h), q/k norms, RoPE and the
KV store (rope_store_kv's kernel), paged attention, o = attn @ Wo, x += o, h = rms_norm(x).

At decode the general path makes some ten op calls a layer, and their Python and dispatch cost
about as much as the arithmetic of a small model's attention (docs/kernels.md, "The attention
block in one call"). This runs each op's own compiled kernel, picked by the op's own size rule,
in the op's order, so every bit is the general path's: batch invariance holds whichever path a
batch takes. It takes projections whose matmul runs a K-quant or block-type (Q4_0 .. Q8_0,
IQ4_NL) gemv at this batch size (matmul.gemv_args); anything else returns None and the caller
runs the general path.
"""

import numba as nb
import numpy as np
from numba.typed import List

from edged.backends.base import Batch, LayerKV, RopeParams, check_sinks
from edged.backends.cpu import kv_codec
from edged.backends.cpu.act_quant import quantized_q8
from edged.backends.cpu.activations import (
    _gelu_tanh_mul_rows, _gelu_tanh_mul_rows_serial, _silu_mul_rows, _silu_mul_rows_serial,
)
from edged.backends.cpu.attention import _CHUNK, _attention_chunks, _combine_chunks, _plan
from edged.backends.cpu.kernel_threads import SERIAL_ELEMENTS
from edged.backends.cpu.matmul import LEGACY_GEMVS, gemv_args, tuned_version
from edged.backends.cpu.matmul_kquants import gemv_kquant
from edged.backends.cpu.moe_step import _block as moe_block, block_args as moe_block_args
from edged.backends.cpu.norm_rope import _rms_norm_rows, _rms_norm_rows_serial
from edged.backends.cpu.rope_store import _rope_store_serial, _step_cos_sin
from edged.quant.tensor import QTensor

_NONE = np.zeros(0, np.float32)  # an absent bias / norm / sinks vector
# the gated activations a dense FFN runs in the step (models/ffn.py names) -> _act's code
FFN_ACTS = {"silu": 0, "gelu_tanh": 1}

# error codes of _block, raised as the ops they stand for raise them
_ERRORS = {
    1: "store_kv: slot out of range (cache holds {slots} slots)",
    2: "attention: seq_starts {starts} do not partition {n} tokens over the {rows} block-table rows",
    3: "attention: negative position",
    4: "attention: a block table entry needed by a position is missing or out of range",
}


@nb.njit(cache=True, nogil=True)
def _norm(x, w, eps, out):
    """rms_norm's kernel for x, by its size rule (runs_serial)."""
    if x.size <= SERIAL_ELEMENTS:
        _rms_norm_rows_serial(x, w, eps, out)
    else:
        _rms_norm_rows(x, w, eps, out)


# module globals the compiled switch below calls by name (unpacking checks there are twelve)
_L0, _L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8, _L9, _L10, _L11 = LEGACY_GEMVS


@nb.njit(cache=True, nogil=True)
def _legacy_gemv(i, w, xq, xd, xs, y, tasks, pf, mode, threads):
    """LEGACY_GEMVS[i] (each its own compiled kernel, called as matmul calls it)."""
    if i == 0:
        _L0(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 1:
        _L1(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 2:
        _L2(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 3:
        _L3(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 4:
        _L4(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 5:
        _L5(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 6:
        _L6(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 7:
        _L7(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 8:
        _L8(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 9:
        _L9(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 10:
        _L10(w, xq, xd, xs, y, tasks, pf, mode, threads)
    elif i == 11:
        _L11(w, xq, xd, xs, y, tasks, pf, mode, threads)


@nb.njit(cache=True, nogil=True)
def _gemv(w, a, xq, xd, xs, m):
    """matmul's gemv of w's rows [m, row_bytes] with its arguments a (gemv_args) -> [n, m]."""
    y = np.empty((xq.shape[0], m), np.float32)  # [n, m]
    if a[0] == 0:
        gemv_kquant(w, xq, xd, xs, y, a[1], a[2], a[3], a[4], a[5], a[6])
    else:
        _legacy_gemv(a[1], w, xq, xd, xs, y, a[3], a[4], a[5], a[6])
    return y


@nb.njit(cache=True, nogil=True)
def _add_row(y, b):
    """y [n, m] += b [m] (numpy's float32 add, as ops.add)."""
    for t in range(y.shape[0]):
        for i in range(y.shape[1]):
            y[t, i] = y[t, i] + b[i]


@nb.njit(cache=True, nogil=True)
def _add_residual(x, f, norm, eps):
    """x float32 [n, d] += rms_norm(f, norm) where norm is not empty, else += f (ops.add's float32
    add, after ops.rms_norm by its size rule)."""
    n, d = x.shape
    if norm.shape[0] > 0:
        fn = np.empty((n, d), np.float32)  # [n, d]
        _norm(f, norm, eps, fn)
        f = fn
    for t in range(n):
        for i in range(d):
            x[t, i] = x[t, i] + f[t, i]


@nb.njit(cache=True, nogil=True)
def _block(x, h_out, cs, n_dims, neox, kc, vc, ks, vs, slots, block_tables, seq_starts, positions, attn_norm, eps, w0,
           a0, m0, w1, a1, m1, w2, a2, m2, nh, bq, bk, bv, q_norm, k_norm, window, scale, cap, sinks, wo, ao, bo,
           post_norm, ffn_norm):
    """x float32 [n, d] += the attention block's output (in place); h_out [n, d] = rms_norm(x,
    ffn_norm). w0..w2: the rows of q|k|v's matrices in order (m_i output columns each, m_i = 0
    for an unused slot); empty vectors stand for absent biases, norms and sinks. Returns 0 or an
    _ERRORS code (x untouched; K/V may be stored, as the ops would have)."""
    n, d = x.shape
    kvh, hd = kc.shape[2], kc.shape[3]
    h = np.empty((n, d), np.float32)  # [n, d]
    _norm(x, attn_norm, eps, h)
    xq, xd, xs = quantized_q8(h)
    qkv = np.empty((n, m0 + m1 + m2), np.float32)  # [n, (nh + 2·kvh)·hd]
    qkv[:, :m0] = _gemv(w0, a0, xq, xd, xs, m0)
    if m1 > 0:
        qkv[:, m0 : m0 + m1] = _gemv(w1, a1, xq, xd, xs, m1)
    if m2 > 0:
        qkv[:, m0 + m1 :] = _gemv(w2, a2, xq, xd, xs, m2)
    q = np.ascontiguousarray(qkv[:, : nh * hd])  # [n, nh·hd]
    k = np.ascontiguousarray(qkv[:, nh * hd : (nh + kvh) * hd])  # [n, kvh·hd]
    v = np.ascontiguousarray(qkv[:, (nh + kvh) * hd :])  # [n, kvh·hd]
    if bq.shape[0] > 0:
        _add_row(q, bq)
        _add_row(k, bk)
        _add_row(v, bv)
    qo = np.empty((n, nh, hd), np.float32)  # [n, nh, hd]
    ko = np.empty((n, kvh, hd), np.float32)  # [n, kvh, hd]
    if _rope_store_serial(q.reshape(n, nh, hd), k.reshape(n, kvh, hd), v.reshape(n, kvh, hd), q_norm, k_norm, eps,
                          cs, n_dims, neox, kc, vc, ks, vs, slots, qo, ko):
        return 1
    chunk, n_chunks = _plan(positions, seq_starts, block_tables.shape[0], window, _CHUNK)
    if chunk < 0:
        return 2 if chunk == -1 else 3
    direct = n_chunks == 1 and sinks.shape[0] == 0
    att = np.empty((n, nh, hd), np.float32)  # [n, nh, hd]
    nc = 1 if direct else n_chunks
    part_m = np.empty((n, nh, nc), np.float32)  # [n, nh, chunks]
    part_l = np.empty((n, nh, nc), np.float32)  # [n, nh, chunks]
    part_acc = np.empty((1, 1, 1, 1) if direct else (n, nh, nc, hd), np.float32)  # [n, nh, chunks, hd]
    err = np.zeros(1, np.int32)
    _attention_chunks(qo, kc, vc, ks, vs, block_tables, seq_starts, positions, window, chunk, n_chunks, direct, scale,
                      cap, att, part_m, part_l, part_acc, err)
    if err[0]:
        return 4
    if not direct:
        _combine_chunks(part_m, part_l, part_acc, sinks, att)
    aq, ad, as_ = quantized_q8(att.reshape(n, nh * hd))
    o = _gemv(wo, ao, aq, ad, as_, d)  # [n, d]
    if bo.shape[0] > 0:
        _add_row(o, bo)
    _add_residual(x, o, post_norm, eps)
    _norm(x, ffn_norm, eps, h_out)
    return 0


@nb.njit(cache=True, nogil=True)
def _block_moe(x, h, cs, n_dims, neox, kc, vc, ks, vs, slots, block_tables, seq_starts, positions, attn_norm, eps, w0,
               a0, m0, w1, a1, m1, w2, a2, m2, nh, bq, bk, bv, q_norm, k_norm, window, scale, cap, sinks, wo, ao, bo,
               post_norm, ffn_norm, router, k_used, gating, norm_topk, mscale, gate_b, probs_b, wg, wu, wd, pg, pu, pd,
               kind_gu, kind_d, n_expert, max_n):
    """_block, then moe_step's _block of its h and the residual add: a MoE layer's decode step
    whole. Returns _block's codes, or 10 + the MoE block's."""
    err = _block(x, h, cs, n_dims, neox, kc, vc, ks, vs, slots, block_tables, seq_starts, positions, attn_norm, eps, w0,
                 a0, m0, w1, a1, m1, w2, a2, m2, nh, bq, bk, bv, q_norm, k_norm, window, scale, cap, sinks, wo, ao, bo,
                 post_norm, ffn_norm)
    if err:
        return err
    f = np.empty_like(x)  # [n, d]
    err = moe_block(router, k_used, gating, norm_topk, mscale, gate_b, probs_b, wg, wu, wd, pg, pu, pd, kind_gu,
                    kind_d, h, n_expert, max_n, f)
    if err:
        return 10 + err
    _add_residual(x, f, np.empty(0, np.float32), eps)
    return 0


@nb.njit(cache=True, nogil=True)
def _act(code, xg, g0, xu, u0, out):
    """The gated activation op's kernel (FFN_ACTS code) by its size rule (runs_serial)."""
    serial = out.size <= SERIAL_ELEMENTS
    if code == 0:
        if serial:
            _silu_mul_rows_serial(xg, g0, xu, u0, out)
        else:
            _silu_mul_rows(xg, g0, xu, u0, out)
    elif serial:
        _gelu_tanh_mul_rows_serial(xg, g0, xu, u0, out)
    else:
        _gelu_tanh_mul_rows(xg, g0, xu, u0, out)


@nb.njit(cache=True, nogil=True)
def _ffn(x, h, eps, wg, ag, mg, wu, au, mu, wd, ad, act, post_norm):
    """x float32 [n, d] += the dense gated FFN of h [n, d] (in place): down(act(gate(h), up(h))),
    then post_norm where it is not empty. mg = 0: gate|up fused in wu (mu = 2·n_ff columns, wg
    unused), else gate's and up's rows apart (mg = mu = n_ff)."""
    n, d = x.shape
    xq, xd, xs = quantized_q8(h)
    if mg == 0:
        gu = _gemv(wu, au, xq, xd, xs, mu)  # [n, 2·n_ff]: gate | up
        a = np.empty((n, mu // 2), np.float32)  # [n, n_ff]
        _act(act, gu, 0, gu, mu // 2, a)
    else:
        g = _gemv(wg, ag, xq, xd, xs, mg)  # [n, n_ff]
        u = _gemv(wu, au, xq, xd, xs, mu)  # [n, n_ff]
        a = np.empty((n, mg), np.float32)  # [n, n_ff]
        _act(act, g, 0, u, 0, a)
    aq, ad_, as_ = quantized_q8(a)
    _add_residual(x, _gemv(wd, ad, aq, ad_, as_, d), post_norm, eps)


@nb.njit(cache=True, nogil=True)
def _block_ffn(x, h, cs, n_dims, neox, kc, vc, ks, vs, slots, block_tables, seq_starts, positions, attn_norm, eps, w0,
               a0, m0, w1, a1, m1, w2, a2, m2, nh, bq, bk, bv, q_norm, k_norm, window, scale, cap, sinks, wo, ao, bo,
               post_norm, ffn_norm, wg, ag, mg, wu, au, mu, wd, ad, act, post_ffn_norm):
    """_block, then _ffn of its h and the residual add: a dense layer's decode step whole.
    Returns _block's codes."""
    err = _block(x, h, cs, n_dims, neox, kc, vc, ks, vs, slots, block_tables, seq_starts, positions, attn_norm, eps, w0,
                 a0, m0, w1, a1, m1, w2, a2, m2, nh, bq, bk, bv, q_norm, k_norm, window, scale, cap, sinks, wo, ao, bo,
                 post_norm, ffn_norm)
    if err:
        return err
    _ffn(x, h, eps, wg, ag, mg, wu, au, mu, wd, ad, act, post_ffn_norm)
    return 0


@nb.njit(cache=True, nogil=True)
def _layers_ffn(x, layers, cs, n_dims, neox, slots, tables, wslots, wtables, seq_starts, positions):
    """x float32 [n, d] through the dense layers of `layers` in order (each a layer_row: its
    sliding-window flag, RoPE index into cs [ropes, n, 2, n_dims/2], K/V arrays, then _block_ffn's
    arguments after positions), in place. Returns (layer, _ERRORS code) of the first layer that
    refused, else (-1, 0). attention_block_step runs one layer so, layers_step a whole stack:
    the one compiled copy of _block_ffn (compiling it costs ~2 minutes)."""
    h = np.empty_like(x)  # [n, d]
    for i in range(len(layers)):
        lay = layers[i]
        win = lay[0]
        err = _block_ffn(x, h, cs[lay[1]], n_dims, neox, lay[2], lay[3], lay[4], lay[5], wslots if win else slots,
                         wtables if win else tables, seq_starts, positions, *lay[6:])
        if err:
            return i, err
    return -1, 0


def layer_row(window: int, rope_index: int, kv: LayerKV, layer) -> tuple:
    """A dense layer's entry in _layers_ffn's list: (sliding window?, RoPE index, K/V arrays,
    _block_ffn's arguments after positions) from _kept_layer_args' value `layer`."""
    return (int(window > 0), rope_index, *kv_codec.kernel_arrays(kv), *layer[0], *layer[2])


def typed_rows(rows):
    """A numba typed list of layer_row tuples, or None where their types differ (one list holds one
    type: a layer whose arrays or knobs are typed otherwise runs apart)."""
    typed = List()
    try:
        for r in rows:
            typed.append(r)
    except Exception:  # noqa: BLE001 — numba's typing errors have no common base
        return None
    return typed


def _one_layer(kv: LayerKV, wo, layer):
    """typed_rows of this one dense layer, kept on wo for the same arguments and caches."""
    key = (id(layer), id(kv.k), id(kv.v), id(kv.k_scale), id(kv.v_scale))
    hit = wo.__dict__.get("_one_layer")
    if hit is not None and hit[0] == key:
        return hit[2]
    rows = typed_rows([layer_row(0, 0, kv, layer)])
    object.__setattr__(wo, "_one_layer", (key, (layer, kv), rows))  # keeps the objects in key alive
    return rows


def _ffn_args(n, d, ffn):
    """_ffn's arguments after eps for ffn = (gate or None, up, down, act, post_ffn_norm), or None
    where the step does not take it (another activation, a projection without a gemv here)."""
    gate, up, down, act, post = ffn
    if act not in FFN_ACTS or up is None or down is None:
        return None
    ws = (up, down) if gate is None else (gate, up, down)
    args = [gemv_args(w, n) for w in ws]  # None also for a matrix that is not 2-D
    if any(a is None for a in args):
        return None
    n_ff = up.shape[0] // 2 if gate is None else up.shape[0]
    if (up.shape[1] != d or down.shape != (d, n_ff) or (gate is None and up.shape[0] % 2)
            or (gate is not None and gate.shape != up.shape)):
        return None
    g = up if gate is None else gate  # an unused slot where gate|up is one matrix (mg = 0)
    return (g.rows(), args[0], 0 if gate is None else n_ff, up.rows(), args[-2], up.shape[0], down.rows(), args[-1],
            FFN_ACTS[act], _vec(post))


def _vec(a) -> np.ndarray:
    return _NONE if a is None else np.ascontiguousarray(a, dtype=np.float32)


def _layer_args(n, d, kv_shape, attn_norm, mats, wo, ffn_norm, eps, scale, window, softcap, q_norm, k_norm, bqkv, bo,
                sinks, post_norm, moe, ffn=None):
    """(_block's arguments after positions, moe_step._block's around h or None, _ffn's after eps
    or None) for n tokens of width d, or None where the step does not apply."""
    if not 1 <= len(mats) <= 3:
        return None
    args = []
    for w in (wo, *mats):  # wo first: a layer of other types is refused at its first lookup
        a = gemv_args(w, n)
        if a is None:
            return None
        args.append(a)
    wo_args, args = args[0], args[1:]
    _, bs, kvh, hd = kv_shape
    cols = [w.shape[0] for w in mats]
    nh = sum(cols) // hd - 2 * kvh
    if (nh < kvh or nh % kvh or sum(cols) != (nh + 2 * kvh) * hd or any(w.shape[1] != d for w in mats)
            or wo.shape != (d, nh * hd) or n * nh * hd > SERIAL_ELEMENTS or (q_norm is None) != (k_norm is None)):
        return None  # the general path names what does not fit, or runs a larger batch
    rows = [w.rows() for w in mats] + [mats[0].rows()] * (3 - len(mats))
    cols += [0] * (3 - len(mats))
    args += [args[0]] * (3 - len(mats))  # unused slots (m = 0 columns)
    args.append(wo_args)
    bq, bk, bv = (None, None, None) if bqkv is None else bqkv
    attn = (_vec(attn_norm), np.float32(eps), rows[0], args[0], cols[0], rows[1], args[1], cols[1], rows[2], args[2],
            cols[2], nh, _vec(bq), _vec(bk), _vec(bv), _vec(q_norm), _vec(k_norm), int(window), np.float32(scale),
            np.float32(softcap), check_sinks(sinks, nh), wo.rows(), args[3], _vec(bo), _vec(post_norm), _vec(ffn_norm))
    margs = None
    if moe is not None:
        margs = moe_block_args(*moe[:10], np.empty((n, d), np.float32), moe[10])
        if margs is not None:
            margs = (*margs[0], *margs[1])
    fargs = _ffn_args(n, d, ffn) if ffn is not None else None
    return attn, margs, fargs


def _kept_layer_args(n, d, kv_shape, *layer):
    """_layer_args, kept on the layer's wo (QTensor's own cache) for the same arguments, batch
    size and tuned kernels: at decode every step asks again with the same objects."""
    wo = layer[2]
    key = (n, d, kv_shape, tuned_version(), *map(id, layer))
    hit = wo.__dict__.get("_attention_step")
    if hit is not None and hit[0] == key:
        return hit[2]
    value = _layer_args(n, d, kv_shape, *layer)
    object.__setattr__(wo, "_attention_step", (key, layer, value))  # layer: keeps the ids in key unique
    return value


def attention_block_step(x: np.ndarray, attn_norm: np.ndarray, mats: tuple, wo: QTensor, ffn_norm: np.ndarray,
                         kv: LayerKV, batch: Batch, rope: RopeParams, eps: float, scale: float, window: int = 0,
                         softcap: float = 0.0, q_norm=None, k_norm=None, bqkv=None, bo=None, sinks=None,
                         post_norm=None, moe=None, ffn=None):
    """The attention block of the residual x float32 [n, d] at decode: x += o (in place) and
    returns (x, rms_norm(x, ffn_norm)), where o is what rms_norm, matmuls over `mats` (1 to 3
    QTensors whose outputs side by side are q|k|v), the biases bqkv = (bq, bk, bv) where given,
    rope_store_kv (q_norm / k_norm, rope; k and v stored in kv at batch.slot_mapping),
    attention (scale, window, softcap, sinks), matmul by wo (+ bo) and the optional post_norm
    give, bit for bit. None where it does not apply (a projection whose matmul would not run a
    K-quant or block-type gemv, an input that is not C-contiguous float32, more than
    rope_store_kv's serial work): the caller runs those ops instead.

    moe, where given, is moe_block_step's arguments but h (router, k, gating, norm_topk, scale,
    gate_b, probs_b, gate, up, down, act): where that op applies too, the same call also adds its
    output for h to x, and returns (x, None): the whole layer. ffn, where given, is a dense
    layer's (gate or None where up holds gate|up, up, down, act, post_ffn_norm or None): where its
    projections run a gemv and act is in FFN_ACTS, the call also adds down(act(gate(h), up(h)))
    (post-normed where given) to x and returns (x, None). What depends only on the weights
    and n is kept between calls made with the same objects (the decoder's per-layer tuples)."""
    n = x.shape[0] if x.ndim == 2 else 0
    if n == 0 or x.dtype != np.float32 or not x.flags.c_contiguous or batch.block_size != kv.k.shape[1]:
        return None
    layer = _kept_layer_args(n, x.shape[1], kv.k.shape, attn_norm, mats, wo, ffn_norm, eps, scale, window, softcap,
                             q_norm, k_norm, bqkv, bo, sinks, post_norm, moe, ffn)
    if layer is None:
        return None
    attn, margs, fargs = layer
    positions = np.ascontiguousarray(batch.positions, dtype=np.int32)
    slots = np.ascontiguousarray(batch.slot_mapping, dtype=np.int32)
    block_tables = np.ascontiguousarray(batch.block_tables, dtype=np.int32)
    if positions.shape != (n,) or slots.shape != (n,) or block_tables.ndim != 2:
        return None
    seq_starts = np.ascontiguousarray(batch.seq_starts, dtype=np.int32)
    cs, n_dims, neox = _step_cos_sin(rope, positions, kv.k.shape[3])
    one = _one_layer(kv, wo, layer) if margs is None and fargs is not None else None
    h = None
    if one is not None:
        err = _layers_ffn(x, one, cs[None], n_dims, neox, slots, block_tables, slots, block_tables, seq_starts,
                          positions)[1]
    else:
        h = np.empty_like(x)  # [n, d]
        step = (x, h, cs, n_dims, neox, *kv_codec.kernel_arrays(kv), slots, block_tables, seq_starts, positions)
        if margs is not None:
            err = _block_moe(*step, *attn, *margs)
        elif fargs is not None:
            err = _block_ffn(*step, *attn, *fargs)
        else:
            err = _block(*step, *attn)
    if err > 10:  # cannot happen: n <= max_n makes every group small, and the routing forms them well
        raise RuntimeError(f"attention_block_step: the routing's groups were refused (code {err - 10})")
    if err:
        raise step_error(err, kv, seq_starts, n, block_tables)
    return x, (h if margs is None and fargs is None else None)


def step_error(err: int, kv: LayerKV, seq_starts, n: int, block_tables) -> ValueError:
    """The ValueError the ops would raise for a block's _ERRORS code err in the layer with KV kv."""
    kc = kv.k
    return ValueError(_ERRORS[err].format(slots=kc.shape[0] * kc.shape[1], starts=seq_starts, n=n,
                                          rows=block_tables.shape[0]))
