"""One weight shape's matmul under several kernel knob settings, in one process: the settings
alternate round by round (a noisy machine's drift hits them alike), the outputs are checked
bit-identical, and the median time and GMAC/s of each are printed.

Knobs are (tasks, prefetch, mode, threads) as typed_kernel.DEFAULT_KNOBS; --kernel gemm forces the
gemm at any n. A shape that fits twice the L3 is cycled over copies past it (weights read from
DRAM, as in a decode step); --hot times one copy.

Usage: python bench/knobs_ab.py Q5_0 2048 640 --n 16,512 --kernel gemm --knobs 0,0,1,0 0,0,0,0
"""

import argparse
import sys
import time

import numpy as np
from gguf import GGMLQuantizationType as T

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
from edged.backends.cpu.act_quant import quantize_activations
from edged.backends.cpu.cold_weights import dram_copies
from edged.quant.synth import random_qtensor

mm = sys.modules["edged.backends.cpu.matmul"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("qtype")
    ap.add_argument("m", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--n", default="16", help="batch sizes, comma-separated")
    ap.add_argument("--knobs", nargs="+", default=["0,0,0,0"], help="tasks,prefetch,mode,threads per setting")
    ap.add_argument("--kernel", choices=("gemv", "gemm"), default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hot", action="store_true")
    a = ap.parse_args()
    settings = [tuple(int(v) for v in s.split(",")) for s in a.knobs]
    raw = random_qtensor(T[a.qtype], a.m, a.k, seed=1)
    base = mm.for_matmul(raw)
    ws = [base] if a.hot else [mm.for_matmul(w) for w in dram_copies([raw])]
    for n in (int(v) for v in a.n.split(",")):
        x = np.random.default_rng(n).standard_normal((n, a.k)).astype(np.float32)  # [n, k]
        qx = quantize_activations(x) if mm.takes_q8(base.qtype) else None
        out = np.empty((n, a.m), np.float32)  # [n, m]
        ref = mm.matmul_knobs(ws[0], x, settings[0], kernel=a.kernel, qx=qx).copy()
        for s in settings[1:]:
            if not np.array_equal(mm.matmul_knobs(ws[0], x, s, kernel=a.kernel, qx=qx), ref):
                raise SystemExit(f"knobs {s} changed the output bits")
        reps = max(len(ws), int(2e9 / (a.m * a.k * n)))
        times = {s: [] for s in settings}
        for r in range(a.rounds):
            for s in settings[r % len(settings):] + settings[:r % len(settings)]:
                t0 = time.perf_counter()
                for i in range(reps):
                    mm.matmul_knobs(ws[i % len(ws)], x, s, kernel=a.kernel, qx=qx, out=out)
                times[s].append((time.perf_counter() - t0) / reps)
        for s in settings:
            t = float(np.median(times[s]))
            print(f"{a.qtype} {a.m}x{a.k} n={n} knobs={','.join(map(str, s))}: {t * 1e3:.3f} ms "
                  f"{a.m * a.k * n / t / 1e9:.1f} GMAC/s ({len(ws)} copies)", flush=True)


if __name__ == "__main__":
    main()
