"""Compile every CUDA kernel for a real GPU target (PTX, sm_90 by default) without a GPU.

The simulator runs kernels as Python, so it never type-checks them the way numba-cuda's CUDA
target does (float32 vs float64 literals, shared-array shapes, shuffles). This script does, with
libNVVM and libdevice from a CUDA toolkit (CUDA_HOME, else /usr/local/cuda*). When NVRTC is absent
(toolkits without it) numba-cuda's architecture lookup and libdevice search are pointed at the
toolkit directly. Must run in a process where numba.cuda is NOT the simulator.

    python tests/backends/cuda/ptx_compile.py [--cc 9.0] [--ptxas]     exit 0: every kernel compiled
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time


def find_libdevice() -> str | None:
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    for r in roots:
        hits = sorted(glob.glob(os.path.join(r, "nvvm", "libdevice", "libdevice*.bc"))) if r else []
        if hits:
            return hits[0]
    return None


def _patch_toolkit(libdevice: str) -> None:
    from numba.cuda.cudadrv import libs, nvrtc, nvvm

    try:
        nvrtc.get_supported_ccs()
    except Exception:  # no NVRTC: take the requested architecture as is
        nvrtc.find_closest_arch = lambda cc: cc
    libs.get_libdevice = lambda: libdevice
    nvvm.get_libdevice = lambda: libdevice


def kernels():
    """(name, python function, signature) of every kernel of the CUDA backend."""
    from gguf import GGMLQuantizationType as T
    from numba.core import types
    from numba.cuda import float32, int8, int32, uint8, uint16

    from edged.backends.cuda import act_quant, activations, attention, embed, matmul, norm_rope
    from edged.backends.cuda.dequant import DECODERS

    f1, i1 = float32[::1], int32[::1]
    f2, i2, u2, q2 = float32[:, ::1], int32[:, ::1], uint8[:, ::1], int8[:, ::1]
    f3, f4 = float32[:, :, ::1], float32[:, :, :, ::1]
    out = []
    for qt in matmul.supported_types():
        mv, tl = matmul.kernels_for(qt)
        if qt in (T.F32, T.F16, T.BF16):
            w = f2 if qt == T.F32 else uint16[:, ::1]
            sig = (w, f2, f2)
            emb = embed._make_float_embed(embed._FLOAT[qt][0])
        else:
            w = u2
            sig = (u2, q2, f2, i2, f2)
            emb = embed._make_block_embed(*DECODERS[qt])
        out += [(f"matvec {qt.name}", mv, sig), (f"tiled {qt.name}", tl, sig), (f"embed {qt.name}", emb, (w, i1, f2))]
    out += [
        ("act_quant", act_quant._quantize_blocks, (f2, q2, f2, i2)),
        ("rms_norm", norm_rope._rms_norm_rows, (f2, f1, float32, f2)),
        ("rope", norm_rope._rope_rows, (f3, i1, int32, int32, float32, float32, f2, float32, f3)),
        ("gelu_mul", activations._gelu_mul, (f1, f1, f1)),
        ("silu_mul", activations._silu_mul, (f1, f1, f1)),
        ("softcap", activations._softcap, (f1, float32, float32, f1)),
        ("add", activations._add, (f1, f1, f1)),
        ("scale", activations._scale, (f1, float32, f1)),
        ("take_rows", activations._take_rows, (f2, i1, f2)),
        ("slice_cols", activations._slice_cols, (f2, int32, f2)),
        ("combine_chunks", attention._combine_chunks, (f3, f3, f4, f1, f3)),
    ]
    # the KV cache types: float32, float16, q8_0 (int8 values, float16 scales)
    h4, q4 = types.float16[:, :, :, ::1], int8[:, :, :, ::1]
    for name, c, s in (("f32", f4, types.none), ("f16", h4, types.none), ("q8_0", q4, h4)):
        out += [(f"zero {name}", attention._zero, (types.Array(c.dtype, 1, "C"),)),
                (f"attention {name} KV", attention._attention,
                 (f3, c, c, s, s, i2, i1, i1, int32, float32, float32, int32, f1, f3, f3, f3, f4))]
    out += [("store_kv f32", attention._store_kv, (f4, f4, f3, f3, i1, float32)),
            ("store_kv f16", attention._store_kv, (h4, h4, f3, f3, i1, float32)),
            ("store_kv q8_0", attention._store_kv_q8, (q4, q4, h4, h4, f3, f3, i1))]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="9.0", help="compute capability, e.g. 8.0 or 9.0")
    ap.add_argument("--ptxas", action="store_true", help="also assemble with the toolkit's ptxas (registers, spills)")
    args = ap.parse_args()
    libdevice = find_libdevice()
    if libdevice is None:
        print("ptx_compile: no CUDA toolkit (libdevice) found", file=sys.stderr)
        return 2
    import edged  # noqa: F401  (numba settings)
    from numba import cuda

    if "simulator" in getattr(cuda.to_device, "__module__", ""):
        print("ptx_compile: numba.cuda is the simulator (unset NUMBA_ENABLE_CUDASIM)", file=sys.stderr)
        return 2
    _patch_toolkit(libdevice)
    cc = tuple(int(v) for v in args.cc.split("."))
    ptxas = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(libdevice))), "bin", "ptxas")
    failed = 0
    for name, kern, sig in kernels():
        t = time.time()
        try:
            ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
        except Exception as e:  # report every failure, not just the first
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            continue
        info = ""
        if args.ptxas and os.path.exists(ptxas):
            with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
                f.write(ptx)
                f.flush()
                res = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", f.name, "-o", os.devnull],
                                     capture_output=True, text=True)
                info = " ".join(line.split(":", 1)[-1].strip() for line in res.stderr.splitlines() if "registers" in line or "spill" in line)
                if res.returncode:
                    failed += 1
                    info = "ptxas FAILED " + res.stderr.strip().splitlines()[-1]
        print(f"ok {name} ({time.time() - t:.1f}s) {info}", flush=True)
    print(f"ptx_compile: {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    sys.exit(main())
