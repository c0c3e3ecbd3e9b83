"""Per-call Python cost of the tuned dispatch in backends/cpu/matmul.py (issue 17 item 1).

    .venv/bin/python bench/tuning_overhead.py [--calls N]

Times, on a tiny Q4_K matmul (n = 1, where Python is most of a call), best of 7 runs of N calls:
- matmul() with no tuned choices (EDGED_TUNE=0), and with one installed for this shape (the
  dict lookup the tuned dispatch adds), and with a thread-count choice (set inside the kernel);
- the dispatch before tuning existed: matmul's checks, then the TypedKernel call (its Python frame);
- the kernel dispatcher called directly, and a trivial @njit with and without the four knob
  arguments (what four more ints cost Numba's dispatcher).
"""

import argparse
import sys
import time

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

mm = sys.modules["edged.backends.cpu.matmul"]
from edged.backends.cpu.act_quant import quantize_activations  # noqa: E402
from edged.quant.synth import random_qtensor  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def before_tuning(w, x, qx, out, kern):
    """matmul as it was before the tuned dispatch: same checks, then the TypedKernel call."""
    plan = mm._DISPATCH.get(w.qtype)
    gemv, gemm, _, q8, max_n = plan
    m, k = w.shape
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError
    n = x.shape[0]
    if out.shape != (n, m) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError
    rows = w.rows()
    kern = kern if n <= max_n else gemm
    xq, xd, xs = qx
    if xq.shape != (n, k) or xd.shape != (n, k // 32) or xs.shape != (n, k // 32):
        raise ValueError
    kern(rows, xq, xd, xs, out)
    return out


@nb.njit(cache=True)
def _kind(a, b, c, d, e, kind):
    return 0


@nb.njit(cache=True)
def _kind_and_knobs(a, b, c, d, e, kind, tasks, pf, mode, threads):
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    calls = ap.parse_args().calls
    w = random_qtensor(T.Q4_K, 16, 256, seed=1)
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)  # [1, 256]
    qx = quantize_activations(x)
    out = np.empty((1, 16), np.float32)  # [1, 16]
    gv = mm.kernels_for(T.Q4_K)[0]
    rows = w.rows()
    figures = {}
    mm.set_tuned({})
    figures["matmul, nothing tuned"] = per_call_us(lambda: mm.matmul(w, x, qx=qx, out=out), calls)
    mm.set_tuned({(T.Q4_K, 16, 256): ((2, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))})
    figures["matmul, a choice for this shape"] = per_call_us(lambda: mm.matmul(w, x, qx=qx, out=out), calls)
    mm.set_tuned({(T.Q4_K, 16, 256): ((2, 0, 0, 1), (0, 0, 0, 0), (0, 0, 0, 0))})
    figures["matmul, a choice with threads=1"] = per_call_us(lambda: mm.matmul(w, x, qx=qx, out=out), calls)
    mm.set_tuned({})
    figures["before tuning: checks + TypedKernel"] = per_call_us(lambda: before_tuning(w, x, qx, out, gv), calls)
    figures["kernel dispatcher alone"] = per_call_us(lambda: gv.kernel(rows, *qx, out, *gv.extra, 0, 0, 0, 0), calls)
    a = np.zeros(4)
    figures["@njit, 5 arrays + kind"] = per_call_us(lambda: _kind(a, a, a, a, a, 1), calls)
    figures["@njit, 5 arrays + kind + 4 knobs"] = per_call_us(lambda: _kind_and_knobs(a, a, a, a, a, 1, 0, 0, 0, 0),
                                                              calls)
    for name, us in figures.items():
        print(f"{name:<40} {us:7.2f} us")


if __name__ == "__main__":
    main()
