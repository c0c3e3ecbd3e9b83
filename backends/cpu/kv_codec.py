"""The CPU KV cache's element types (f32, f16, q8_0): allocation, conversion on store, and the
row reader attention's tiles call (kv_row), which widens one f16 / q8_0 row of a block into a
float32 scratch row as it is read, so no float32 copy of the cache ever exists.

Numba has no float16 arrays: f16 caches are float16 numpy arrays passed to kernels as uint16
views, converted with the CPU's own instructions (fpext / fptrunc of LLVM's half: vcvtph2ps /
vcvtps2ph with F16C; round to nearest even, as numpy's astype). q8_0 follows llama.cpp's
quantize_row_q8_0: per 32 features d = amax / 127, q = rint(x / d) (x times 1/d in float32), d
stored as float16; a value reads back as q * float32(f16(d)).
"""

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from edged.backends.base import F16_MAX, Q8_KV_BLOCK, LayerKV, check_kv_type, kv_shape
from edged.backends.cpu.kernel_threads import runs_serial

QB = Q8_KV_BLOCK
# adding then subtracting 1.5 * 2^23 rounds |x| < 2^22 to the nearest integer, ties to even (act_quant.py)
_ROUND_MAGIC = np.float32(12582912.0)
_NO_SCALES = np.zeros((1, 1, 1, 1), dtype=np.uint16)  # the scale planes' stand-in for f32 / f16


@intrinsic
def h2f(typingctx, h):
    """float32 value of the IEEE half whose bits are the uint16 h (exact)."""
    if h != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def f2h(typingctx, x):
    """Bits (uint16) of float32 x rounded to IEEE half, to nearest even (inf past 65504)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


def _resident(shape, dtype) -> np.ndarray:
    """A zeroed array whose pages are all touched now: np.zeros' calloc maps them lazily, so a pool
    whose LRU free queue cycles through every block grew RSS for as long as a server ran (the soak's
    RSS line); llama.cpp clears its KV buffer at start for the same reason."""
    a = np.empty(shape, dtype)
    a.fill(0)
    return a


def allocate(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, kv_type: str) -> LayerKV:
    """One layer's zeroed, resident cache of kv_type: k, v [nb, bs, kvh, hd] (+ q8_0 scales [.., hd / 32])."""
    shape = kv_shape(num_blocks, block_size, n_kv_heads, head_dim)
    check_kv_type(kv_type, shape[3])
    if kv_type == "q8_0":
        sshape = (*shape[:3], shape[3] // QB)
        return LayerKV(k=_resident(shape, np.int8), v=_resident(shape, np.int8),
                       k_scale=_resident(sshape, np.float16), v_scale=_resident(sshape, np.float16))
    dtype = np.float32 if kv_type == "f32" else np.float16
    return LayerKV(k=_resident(shape, dtype), v=_resident(shape, dtype))


def kernel_arrays(kv: LayerKV) -> tuple:
    """(k, v, k_scale, v_scale) as kernels take them: float16 planes as uint16 views, and a
    [1, 1, 1, 1] stand-in for the scales of f32 / f16 caches."""
    k, v = kv.k, kv.v
    if k.dtype == np.float16:
        k, v = k.view(np.uint16), v.view(np.uint16)
    if kv.k_scale is None:
        return k, v, _NO_SCALES, _NO_SCALES
    return k, v, kv.k_scale.view(np.uint16), kv.v_scale.view(np.uint16)


def kv_row(cache, scales, blk, o, kh, buf, i):
    """float32 [hd] values of cache[blk, o, kh]: the row itself for f32, else widened into buf[i]
    (i < 4; buf float32 [5, hd], row 4 scratch for q8_0's scales)."""
    raise NotImplementedError  # compiled through the overload below


@overload(kv_row, inline="always", jit_options={"fastmath": {"reassoc", "contract", "nsz", "arcp"}})
def _kv_row(cache, scales, blk, o, kh, buf, i):
    if cache.dtype == types.float32:
        return lambda cache, scales, blk, o, kh, buf, i: cache[blk, o, kh]
    if cache.dtype == types.uint16:
        def f16_row(cache, scales, blk, o, kh, buf, i):
            src = cache[blk, o, kh]
            dst = buf[i]
            for d in range(dst.shape[0]):
                dst[d] = h2f(src[d])
            return dst
        return f16_row
    if cache.dtype == types.int8:
        def q8_row(cache, scales, blk, o, kh, buf, i):
            src = cache[blk, o, kh]
            sc = scales[blk, o, kh]
            dst = buf[i]
            full = buf[4]  # each feature's scale: one flat loop then vectorizes (a loop per
            for b in range(sc.shape[0]):  # 32-feature block was unrolled to scalar code, 2.5x slower)
                d = h2f(sc[b])
                for j in range(QB):
                    full[b * QB + j] = d
            for j in range(dst.shape[0]):
                dst[j] = np.float32(src[j]) * full[j]
            return dst
        return q8_row
    return None


def put_row(cache, scales, blk, o, kh, src):
    """cache[blk, o, kh] = float32 row src [hd], converted to the cache's type."""
    raise NotImplementedError  # compiled through the overload below


@overload(put_row)
def _put_row(cache, scales, blk, o, kh, src):
    if cache.dtype == types.float32:
        def f32_put(cache, scales, blk, o, kh, src):
            dst = cache[blk, o, kh]
            for d in range(src.shape[0]):
                dst[d] = src[d]
        return f32_put
    if cache.dtype == types.uint16:
        def f16_put(cache, scales, blk, o, kh, src):
            dst = cache[blk, o, kh]
            for d in range(src.shape[0]):
                x = src[d]
                if x > F16_MAX:  # NaN compares false: it stays NaN
                    x = F16_MAX
                elif x < -F16_MAX:
                    x = -F16_MAX
                dst[d] = f2h(x)
        return f16_put
    if cache.dtype == types.int8:
        def q8_put(cache, scales, blk, o, kh, src):
            dst = cache[blk, o, kh]
            sc = scales[blk, o, kh]
            for b in range(sc.shape[0]):
                amax = np.float32(0.0)
                for j in range(b * QB, b * QB + QB):
                    amax = max(amax, abs(src[j]))
                d = amax / np.float32(127.0)
                if d > F16_MAX:  # the values saturate at +-127 d below
                    d = F16_MAX
                inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
                for j in range(b * QB, b * QB + QB):
                    q = (src[j] * inv + _ROUND_MAGIC) - _ROUND_MAGIC
                    dst[j] = np.int8(min(max(q, np.float32(-127.0)), np.float32(127.0)))
                sc[b] = f2h(d)
        return q8_put
    return None


@nb.njit(nogil=True, inline="always")
def _store(kc, vc, ks, vs, k, v, slots):
    n_blocks, bs, kvh, hd = kc.shape
    cap = n_blocks * bs
    bad = 0
    for i in nb.prange(k.shape[0]):
        s = slots[i]
        if s < 0:
            continue  # padding token: nothing to store
        if s >= cap:
            bad += 1
            continue
        b = s // bs
        o = s - b * bs
        for h in range(kvh):
            put_row(kc, ks, b, o, h, k[i, h])
            put_row(vc, vs, b, o, h, v[i, h])
    return bad


@nb.njit(parallel=True, nogil=True, cache=True)
def _store_rows(kc, vc, ks, vs, k, v, slots):
    return _store(kc, vc, ks, vs, k, v, slots)


@nb.njit(nogil=True, cache=True)
def _store_rows_serial(kc, vc, ks, vs, k, v, slots):
    return _store(kc, vc, ks, vs, k, v, slots)


def store_rows(kc, vc, ks, vs, k, v, slots) -> int:
    """Write k/v float32 [n, kvh, hd] rows to kc/vc [nb, bs, kvh, hd] (and q8_0 scales ks/vs) at
    slots, converted to the cache's type; negative slots are skipped; returns #slots past the cache."""
    return (_store_rows_serial if runs_serial(k) else _store_rows)(kc, vc, ks, vs, k, v, slots)
