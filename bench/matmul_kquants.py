"""K-quant matmul kernel speed on Gemma 3 270M's layer shapes, next to numpy BLAS in the same run.

For each type (real Q4_K / Q6_K ffn_down [640, 2048] tensors of the default model, synthesized
tensors of that shape for the other types) and each n, prints the median kernel time, process CPU
time, ns per 256-element superblock (per token-column; × threads for per-thread cost), weight GB/s
(weight bytes / time; at n > 1 the weights are read once per call) and numpy's
x @ W_f32.T on the dequantized weights. Activation quantization is timed apart (shared by all
matmuls of one x in a forward pass).
BLAS runs with OPENBLAS_NUM_THREADS = NUMBA_NUM_THREADS unless set.
Usage: NUMBA_NUM_THREADS=1 .venv/bin/python bench/matmul_kquants.py [--repeat 200] [--types Q4_K,Q6_K]
       [--ns 1,2,4,8,16,64,512]
"""

import argparse
import os
import time

# BLAS gets as many threads as the kernels (an oversubscribed OpenBLAS spins and times nonsense)
os.environ.setdefault("OPENBLAS_NUM_THREADS", os.environ.get("NUMBA_NUM_THREADS", "2"))

import edged  # noqa: F401  (numba settings before numba is imported)
import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from edged.backends.cpu import matmul_kquants as mk
from edged.backends.cpu.act_quant import quantize_activations
from edged.backends.cpu.matmul import GEMV_MAX_N
from edged.quant.synth import random_qtensor


def _median_time(fn, repeat: int) -> tuple[float, float]:
    """(median wall seconds, median process-CPU seconds) of fn() over `repeat` calls."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(wall)), float(np.median(cpu))


def _tensors(types):
    """{qtype: QTensor [640, 2048]}: the default model's ffn_down where it has the type."""
    found = {}
    try:
        from edged.quant.gguf import load_gguf
        from edged.model_path import resolve_reference_model

        for t in load_gguf(resolve_reference_model()).tensors.values():
            if t.qtype in types and t.qtype not in found and "ffn_down" in t.name:
                found[t.qtype] = t
    except Exception as e:  # noqa: BLE001 - the bench still runs on synthesized tensors
        print(f"(default model unavailable: {e})")
    for qt in types:
        found.setdefault(qt, random_qtensor(qt, 640, 2048, seed=0))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--types", default="Q4_K,Q6_K,Q5_K,Q2_K,Q3_K,IQ4_XS")
    ap.add_argument("--ns", default="1,2,4,8,16,64,512")
    args = ap.parse_args()
    types = [T[name] for name in args.types.split(",")]
    ns = [int(v) for v in args.ns.split(",")]
    threads = nb.get_num_threads()
    rng = np.random.default_rng(0)
    print(f"threads {threads}, median of {args.repeat} (fewer for big n)")
    print(f"{'type':>7} {'n':>4} {'kern us':>9} {'cpu us':>9} {'ns/blk/col':>10} {'GB/s':>7}"
          f" {'BLAS us':>9} {'BLAS cpu':>9} {'vs BLAS':>7} {'cols/s vs n=1':>13} {'quant us':>9}")
    for qt, w in _tensors(types).items():
        m, k = w.shape
        rows = w.rows()
        wf = dequantize(w.data.reshape(m, -1), qt).astype(np.float32).reshape(m, k)  # [m, k]
        n_sb = m * k // 256
        base_cols = None
        for n in ns:
            x = rng.standard_normal((n, k)).astype(np.float32)  # [n, k]
            xq, xd, xs = quantize_activations(x)
            y = np.empty((n, m), np.float32)  # [n, m]
            gemv, gemm = mk.KERNELS[qt]
            kern = gemv if n <= GEMV_MAX_N else gemm  # as matmul() dispatches
            rep = max(5, args.repeat // max(1, n // 16))
            t, c = _median_time(lambda: kern(rows, xq, xd, xs, y), rep)
            tb, cb = _median_time(lambda: x @ wf.T, rep)
            tq, _ = _median_time(lambda: quantize_activations(x), rep)
            cols = n / t
            if n == 1:
                base_cols = cols
            ratio = f"{cols / base_cols:.1f}x" if base_cols else "-"
            print(f"{qt.name:>7} {n:>4} {t * 1e6:9.1f} {c * 1e6:9.1f} {t * 1e9 / n_sb / n:10.2f}"
                  f" {rows.nbytes / t / 1e9:7.2f} {tb * 1e6:9.1f} {cb * 1e6:9.1f} {tb / t:6.2f}x"
                  f" {ratio:>13} {tq * 1e6:9.1f}")


if __name__ == "__main__":
    main()
