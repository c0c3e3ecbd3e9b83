"""layers_step: a decode step's whole layer stack in one compiled call, where every layer is a
dense one that attention_block_step runs whole (its attention block and FFN, attn_step._block_ffn).

At decode each layer's attention_block_step costs ~20 µs of Python around its compiled block
(argument lookups, the step's arrays, the call): ~0.4 ms of a ~9 ms single-sequence step for an
18-layer model, on a core whose caches the weights have just flushed (docs/kernels.md, "The
layer stack in one call"). Here the per-layer arguments are built once into a typed list, and
one call runs _block_ffn for each layer in order: the same kernels on the same arguments, so the
bits are the per-layer path's (attention_block_step runs a dense layer through the same
compiled loop, a list of one).
"""

import numpy as np

from edged.backends.base import Batch
from edged.backends.cpu.attn_step import _kept_layer_args, _layers_ffn, layer_row, step_error, typed_rows
from edged.backends.cpu.matmul import tuned_version
from edged.backends.cpu.rope_store import _step_cos_sin


def _plan(n, d, steps, kvs):
    """(attn_step.typed_rows of every layer, the distinct RoPE params in index order), or None
    where some layer is not a dense one _layers_ffn runs (or the rows' types differ)."""
    ropes, rows = [], []
    for args, kv in zip(steps, kvs):
        layer = _kept_layer_args(n, d, kv.k.shape, *args[:4], *args[5:])  # attention_block_step's but rope
        if layer is None or layer[1] is not None or layer[2] is None:  # not a dense layer run whole
            return None
        rope = args[4]
        ri = next((i for i, r in enumerate(ropes) if r is rope), None)
        if ri is None:
            ri, _ = len(ropes), ropes.append(rope)
        rows.append(layer_row(args[7], ri, kv, layer))  # args[7]: the sliding window
    typed = typed_rows(rows)
    return None if typed is None else (typed, ropes)


def _kept_plan(n, d, steps, kvs):
    """_plan, kept on the first layer's wo per batch size for the same steps, caches and tuned
    kernels; other caches (a new engine's) replace every kept plan, so none holds old KV alive."""
    wo = steps[0][2]
    key = (d, tuned_version(), id(steps), len(steps), *(id(kv.k) for kv in kvs))
    kept = wo.__dict__.get("_layers_step")
    if kept is None or kept[0] != key:
        kept = (key, (steps, kvs), {})  # keeps the objects whose ids are in key alive
        object.__setattr__(wo, "_layers_step", kept)
    plans = kept[2]
    if n not in plans:
        plans[n] = _plan(n, d, steps, kvs)
    return plans[n]


def layers_step(x: np.ndarray, steps: list, kvs: list, batch: Batch):
    """x float32 [n, d] through every layer at decode, in place, as attention_block_step with
    each layer's arguments steps[i] (its tuple after x: attention_block_step's arguments but x, kv
    and batch, in the decoder's order) and KV kvs[i] would take it, bit for bit. None where that
    does not hold for every layer (nothing is run then): the caller runs the layers one by one."""
    n = x.shape[0] if x.ndim == 2 else 0
    if (n == 0 or x.dtype != np.float32 or not x.flags.c_contiguous or not steps or len(steps) != len(kvs)
            or any(batch.block_size != kv.k.shape[1] for kv in kvs)):
        return None
    plan = _kept_plan(n, x.shape[1], steps, kvs)
    if plan is None:
        return None
    layers, ropes = plan
    positions = np.ascontiguousarray(batch.positions, dtype=np.int32)
    if positions.shape != (n,):
        return None
    hd = kvs[0].k.shape[3]
    if any(kv.k.shape[3] != hd for kv in kvs):
        return None
    cs = [_step_cos_sin(r, positions, hd) for r in ropes]
    if any(c[1:] != cs[0][1:] or c[0].shape != cs[0][0].shape for c in cs):
        return None  # RoPEs of different widths or pairings: one call takes one
    wb = batch.window_view()
    arrays = [np.ascontiguousarray(a, dtype=np.int32) for a in (batch.slot_mapping, batch.block_tables,
                                                                  wb.slot_mapping, wb.block_tables, batch.seq_starts)]
    if arrays[0].shape != (n,) or arrays[2].shape != (n,) or arrays[1].ndim != 2 or arrays[3].ndim != 2:
        return None
    i, err = _layers_ffn(x, layers, np.stack([c[0] for c in cs]), cs[0][1], cs[0][2], *arrays, positions)
    if err:
        b = wb if steps[i][7] > 0 else batch
        raise step_error(err, kvs[i], b.seq_starts, n, b.block_tables)
    return x
