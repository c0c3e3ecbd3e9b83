"""rope_store_kv: a step's attention inputs in one call. q and k go through their per-head RMS norms
(where the model has them) and RoPE, k and v are written into the paged cache, and q is returned.

It computes what rms_norm, rope and store_kv compute one after another (base.rope_store_kv_by_ops,
which backends without this op run), with the same per-token arithmetic, so the bits never depend
on the path. A small batch is one compiled call in the calling thread: at decode, five separate
calls cost more in dispatch than their work (docs/kernels.md, "Small ops at decode"). Both paths
rotate by one (cos, sin) table per RoPE and step, shared by q, k and every layer.
"""

import numba as nb
import numpy as np

from edged.backends.base import LayerKV, RopeParams
from edged.backends.cpu import kv_codec
from edged.backends.cpu.attention import store_kv
from edged.backends.cpu.kernel_threads import runs_serial
from edged.backends.cpu.norm_rope import (
    _rms_norm_rows_serial, cs_rows, rms_norm, rope_kernel_args, rotate_rows_with, rotate_rows_with_parallel,
)

_NO_NORM = np.zeros(0, np.float32)


@nb.njit(nogil=True, cache=True)
def _rope_store_serial(q, k, v, q_norm, k_norm, eps, cs, n_dims, neox, kc, vc, ks, vs, slots, qo, ko):
    """qo [n, h, hd], ko [n, kvh, hd] = rope(rms_norm(q / k)) (no norm when q_norm is empty) with
    the positions' (cos, sin) cs [n, 2, n_dims/2]; k as ko and v stored at slots. Each step calls
    the serial op's own kernel (its own fastmath flags: inlined here, they would take this
    function's). Returns the slots past the cache."""
    n, nh, hd = q.shape
    kvh = k.shape[1]
    if q_norm.shape[0] > 0:
        _rms_norm_rows_serial(q.reshape(n * nh, hd), q_norm, eps, qo.reshape(n * nh, hd))
        _rms_norm_rows_serial(k.reshape(n * kvh, hd), k_norm, eps, ko.reshape(n * kvh, hd))
        rotate_rows_with(qo, cs, n_dims, neox, qo)
        rotate_rows_with(ko, cs, n_dims, neox, ko)
    else:
        rotate_rows_with(q, cs, n_dims, neox, qo)
        rotate_rows_with(k, cs, n_dims, neox, ko)
    return kv_codec._store_rows_serial(kc, vc, ks, vs, ko, v, slots)


def _step_cos_sin(p: RopeParams, positions: np.ndarray, hd: int) -> tuple:
    """(cs float32 [n, 2, n_dims/2], n_dims, neox) of these positions under p, kept on p: every
    layer with this RoPE asks for the same ones in a step (a step's trig, done once)."""
    # keyed by p's fields, not by rope_kernel_args' results: deriving those costs ~2.6 µs a call;
    # positions as bytes: cheaper to compare than arrays
    key = (hd, p.dim, p.freq_base, p.neox, p.freq_scale, p.ext_factor, p.attn_factor, p.orig_ctx, p.beta_fast,
           p.beta_slow, positions.tobytes())
    hit = p.__dict__.get("_step_cs")
    if hit is not None and hit[0] == key and hit[1] is p.freq_factors:
        return hit[2:]
    n_dims, neox, theta_scale, freq_scale, table, mscale = rope_kernel_args(p, hd)
    cs = cs_rows(positions, n_dims, theta_scale, freq_scale, table, mscale)
    p.__dict__["_step_cs"] = (key, p.freq_factors, cs, n_dims, neox)
    return cs, n_dims, neox


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _check(q, k, v, kv: LayerKV, positions, slots, q_norm, k_norm):
    n, _, hd = q.shape
    kvh = kv.k.shape[2]
    if k.shape != (n, kvh, hd) or v.shape != k.shape or kv.k.shape[3] != hd:
        raise ValueError(f"rope_store_kv: q {q.shape}, k {k.shape}, v {v.shape} do not fit a cache of "
                         f"{kvh} kv heads x {kv.k.shape[3]}")
    if positions.shape != (n,) or slots.shape != (n,):
        raise ValueError(f"rope_store_kv: positions {positions.shape} / slot_mapping {slots.shape} must be ({n},)")
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and (q_norm.shape != (hd,) or k_norm.shape != (hd,))):
        raise ValueError(f"rope_store_kv: q_norm and k_norm must both be None or both [{hd}]")


def _rotate(x, cs, n_dims, neox, out):
    (rotate_rows_with if runs_serial(x) else rotate_rows_with_parallel)(x, cs, n_dims, neox, out)


def _rope_store_pool(q, k, v, kv, positions, slots, p, eps, q_norm, k_norm):
    """base.rope_store_kv_by_ops' steps on the thread pool, rotating by the step's kept (cos, sin)
    table: each token's trig, computed again for q and k of every layer, was over half of a
    prefill's rope_store_kv (docs/kernels.md, "A prefill's RoPE table")."""
    n, nh, hd = q.shape
    if q_norm is not None:
        q = rms_norm(q.reshape(n * nh, hd), q_norm, eps).reshape(q.shape)
        k = rms_norm(k.reshape(n * k.shape[1], hd), k_norm, eps).reshape(k.shape)
    cs, n_dims, neox = _step_cos_sin(p, positions, hd)
    qo, ko = np.empty_like(q), np.empty_like(k)
    _rotate(q, cs, n_dims, neox, qo)
    _rotate(k, cs, n_dims, neox, ko)
    store_kv(kv, ko, v, slots)
    return qo


def rope_store_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray, kv: LayerKV, positions: np.ndarray,
                  slot_mapping: np.ndarray, p: RopeParams, eps: float, q_norm: np.ndarray | None = None,
                  k_norm: np.ndarray | None = None) -> np.ndarray:
    """q [n, h, hd], k / v [n, kvh, hd] -> rope(q') [n, h, hd] with k' = rope(k') stored with v at
    slot_mapping; x' = rms_norm over each head's hd features (q_norm / k_norm [hd]) or x itself."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"rope_store_kv: q {q.shape}, k {k.shape}, v {v.shape} must be [n, heads, head_dim]")
    q, k, v = _f32(q), _f32(k), _f32(v)
    positions = np.ascontiguousarray(positions, dtype=np.int32)
    slots = np.ascontiguousarray(slot_mapping, dtype=np.int32)
    _check(q, k, v, kv, positions, slots, q_norm, k_norm)
    if not (runs_serial(q) and runs_serial(k)):  # a prefill
        return _rope_store_pool(q, k, v, kv, positions, slots, p, eps, q_norm, k_norm)
    qo, ko = np.empty_like(q), np.empty_like(k)
    bad = _rope_store_serial(
        q, k, v, _NO_NORM if q_norm is None else _f32(q_norm), _NO_NORM if k_norm is None else _f32(k_norm),
        np.float32(eps), *_step_cos_sin(p, positions, q.shape[2]), *kv_codec.kernel_arrays(kv), slots, qo, ko)
    if bad:
        raise ValueError(f"store_kv: slot out of range (cache holds {kv.k.shape[0] * kv.k.shape[1]} slots)")
    return qo
