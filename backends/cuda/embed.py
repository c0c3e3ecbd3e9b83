"""Token embedding on the device: gather rows of a GGUF weight and dequantize only those rows."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32

from edged.backends.cuda.dequant import DECODERS, K16
from edged.backends.cuda.launch import launch_1d
from edged.backends.cuda.matmul_float import bf16_value, f16_value, f32_value
from edged.backends.cuda.memory import DeviceMatrix, as_device, is_device
from edged.quant.dequant import checked_indices

_FLOAT = {T.F32: (f32_value, np.float32), T.F16: (f16_value, np.uint16), T.BF16: (bf16_value, np.uint16)}
_KERNELS: dict = {}


def _make_block_embed(load4, scales, family):
    @cuda.jit
    def kern(w, ids, out):
        """One thread per (token, 4-element group): out[t, e] = s · u_e + c (NaN row for a bad id)."""
        n, k = out.shape
        ng = k // 4
        i = cuda.grid(1)
        if i >= n * ng:
            return
        t = i // ng
        e = (i % ng) * 4
        r = ids[t]
        if r < 0 or r >= w.shape[0]:
            for z in range(4):
                out[t, e + z] = float32(np.nan)
            return
        b = e // 32
        g = (e % 32) // 4
        u0, u1, u2, u3 = load4(w, r, b, g)
        s, c = scales(w, r, b, g // 4 if family == K16 else 0)
        out[t, e] = s * float32(u0) + c
        out[t, e + 1] = s * float32(u1) + c
        out[t, e + 2] = s * float32(u2) + c
        out[t, e + 3] = s * float32(u3) + c

    return kern


def _make_float_embed(value):
    @cuda.jit
    def kern(w, ids, out):
        n, k = out.shape
        i = cuda.grid(1)
        if i >= n * k:
            return
        t = i // k
        j = i % k
        r = ids[t]
        if r < 0 or r >= w.shape[0]:
            out[t, j] = float32(np.nan)
        else:
            out[t, j] = value(w, r, j)

    return kern


def embed(w: DeviceMatrix, ids):
    """Rows `ids` (int32 [n], host or device) of w as a device float32 [n, k]. Host ids are range-
    checked (ValueError naming the id); a bad id in a device array yields a NaN row instead."""
    if not isinstance(w, DeviceMatrix):
        raise TypeError(f"embed weight must be a DeviceMatrix, got {type(w).__name__}")
    m, k = w.shape
    if not is_device(ids):
        ids = checked_indices(ids, m, "token id", f" in {w.name!r}")
    ids = as_device(ids, np.int32, "embed ids")
    if ids.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {tuple(ids.shape)}")
    n = int(ids.shape[0])
    out = cuda.device_array((n, k), dtype=np.float32)  # [n, k]
    if n == 0:
        return out
    qt = w.qtype
    if qt not in _KERNELS:
        if qt in _FLOAT:
            _KERNELS[qt] = _make_float_embed(_FLOAT[qt][0])
        elif qt in DECODERS:
            _KERNELS[qt] = _make_block_embed(*DECODERS[qt])
        else:
            raise ValueError(f"no CUDA embed kernel for tensor type {qt.name}")
    if qt in _FLOAT:
        blocks, threads = launch_1d(n * k)
        _KERNELS[qt][blocks, threads](w.rows.view(_FLOAT[qt][1]), ids, out)
    else:
        blocks, threads = launch_1d(n * (k // 4))
        _KERNELS[qt][blocks, threads](w.rows, ids, out)
    return out
