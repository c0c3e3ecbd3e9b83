"""Raw GGUF rows against the CPU backend's grouped rows (backends/cpu/legacy_groups.py), in one
process, the two layouts alternating so that a noisy machine shifts both alike.

  kernels: one random tensor per shape, hot (one tensor) and cold (copies past twice the L3),
           n = 1 and 16; median times and the median of the per-round ratios grouped / raw.
  step:    every weight of a model in forward order (a decode step's matmuls), n tokens, the two
           layouts alternating step by step; the paired median ratio.

Usage: python bench/legacy_groups_ab.py kernels [--rounds 7]
       python bench/legacy_groups_ab.py step [--model GGUF] [--n 1] [--output] [--steps 300]
"""

import argparse
import sys
import time

import numpy as np
from gguf import GGMLQuantizationType as T

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)

mm = sys.modules["edged.backends.cpu.matmul"]
SHAPES = [(T.Q5_0, 2048, 640), (T.Q5_0, 1024, 640), (T.Q8_0, 262144, 640), (T.Q4_0, 2048, 2048),
          (T.Q4_1, 1536, 576), (T.Q4_1, 576, 1536), (T.Q4_1, 192, 576)]


def _time(ws, x, out, calls):
    mm.matmul(ws[0], x, out=out)
    t0 = time.perf_counter()
    for i in range(calls):
        mm.matmul(ws[i % len(ws)], x, out=out)
    return (time.perf_counter() - t0) / calls


def kernels(rounds: int) -> None:
    from edged.backends.cpu.cold_weights import dram_copies
    from edged.quant.synth import random_qtensor

    for qtype, m, k in SHAPES:
        raw = dram_copies(random_qtensor(qtype, m, k, seed=1))
        grouped = [mm.for_matmul(w) for w in raw]
        for n in (1, 16):
            x = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
            out = np.empty((n, m), np.float32)
            for mode in ("hot", "cold"):
                pick = (lambda ws: ws) if mode == "cold" else (lambda ws: ws[:1])
                calls = max(4, min(80, int(2e8 // raw[0].data.nbytes))) * (len(raw) if mode == "cold" else 1)
                tr, tg = [], []
                for r in range(rounds):
                    order = ((tr, raw), (tg, grouped)) if r % 2 == 0 else ((tg, grouped), (tr, raw))
                    for times, ws in order:
                        times.append(_time(pick(ws), x, out, calls))
                ratio = np.median(np.array(tg) / np.array(tr))
                print(f"{qtype.name} {m}x{k} n={n} {mode}: raw {np.median(tr) * 1e6:.1f} us, grouped "
                      f"{np.median(tg) * 1e6:.1f} us, grouped/raw {ratio:.3f}", flush=True)


def step(model: str | None, n: int, output: bool, steps: int) -> None:
    from edged.loader import load

    lm = load(model, quiet=True)
    raw = [w for _, w in lm.model.matrices()]
    grouped = [w for _, w in lm.model.matrices(placed=True)]
    if not output:
        raw, grouped = raw[1:], grouped[1:]
    xs = {w.shape[1]: np.random.default_rng(0).standard_normal((n, w.shape[1])).astype(np.float32) for w in raw}

    def one(ws):
        t0 = time.perf_counter()
        for w in ws:
            mm.matmul(w, xs[w.shape[1]])
        return time.perf_counter() - t0

    one(raw), one(grouped)
    tr, tg = [], []
    for i in range(steps):
        for times, ws in ((tr, raw), (tg, grouped)) if i % 2 == 0 else ((tg, grouped), (tr, raw)):
            times.append(one(ws))
    ratio = np.array(tg) / np.array(tr)
    print(f"{lm.path.name} n={n} output={output}: raw {np.median(tr) * 1e3:.3f} ms, grouped "
          f"{np.median(tg) * 1e3:.3f} ms per step; grouped/raw paired median {np.median(ratio):.3f} "
          f"(quartiles {np.quantile(ratio, 0.25):.3f}-{np.quantile(ratio, 0.75):.3f}, {steps} steps)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("kernels", "step"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--model", default=None, help="GGUF path or store name (default: the default model)")
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--output", action="store_true", help="step: include the output projection")
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    if a.what == "kernels":
        kernels(a.rounds)
    else:
        step(a.model, a.n, a.output, a.steps)


if __name__ == "__main__":
    main()
