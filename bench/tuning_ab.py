"""This CPU's tuned kernel choices against the defaults, on whole decode steps, in one process.

Loads a model (which tunes it for this CPU, or reads the cached choices), then alternates rounds
of `--tokens` single-stream decode steps with the defaults installed and with the tuned choices,
in a rotating order, and reports the median step time of each and the median of the per-round
ratios (the two sides of a round run back to back, so drift of a noisy machine cancels).

Usage: python bench/tuning_ab.py [--model GGUF] [--rounds 9] [--tokens 48] [--context 256]
"""

import argparse
import statistics
import sys
import time

import numpy as np

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
from edged.backends.base import Batch
from edged.loader import load

mm = sys.modules["edged.backends.cpu.matmul"]  # the module (the package re-exports its matmul function)


def decode_ms(model, kv, ids, start: int, tokens: int, n_blocks: int, bs: int) -> float:
    """Median ms of `tokens` decode steps at positions start.. (the KV before `start` is filled)."""
    times = []
    for i in range(tokens):
        t0 = time.perf_counter()
        model.forward(Batch.single(ids[start + i : start + i + 1], start + i, n_blocks, bs), kv)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="store name or .gguf (default: the reference model)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=48, help="decode steps per side per round")
    ap.add_argument("--context", type=int, default=256, help="tokens in the KV before the decode steps")
    a = ap.parse_args(argv)
    from edged.model_path import resolve_reference_model

    lm = load(a.model or str(resolve_reference_model()), quiet=False)
    model = lm.model
    choices = mm.tuned()
    if not choices:
        print("tuning_ab: no tuned choices are installed (EDGED_TUNE=0, or every class kept its default)")
        return 0
    bs = 16
    n_blocks = -(-(a.context + a.tokens + 1) // bs) + 1
    kv = model.allocate_kv(n_blocks, bs)
    ids = np.random.default_rng(0).integers(0, model.vocab_size, a.context + a.tokens + 1).astype(np.int32)
    model.forward(Batch.single(ids[: a.context], 0, n_blocks, bs), kv)
    sides = {"default": {}, "tuned": choices}
    times = {s: [] for s in sides}
    for r in range(a.rounds):
        for s in (("default", "tuned") if r % 2 == 0 else ("tuned", "default")):
            mm.set_tuned(sides[s])
            times[s].append(decode_ms(model, kv, ids, a.context, a.tokens, n_blocks, bs))
    mm.set_tuned(choices)
    ratios = [t / d for t, d in zip(times["tuned"], times["default"])]
    for s in sides:
        print(f"{s:<8} step ms: median {statistics.median(times[s]):.3f}  rounds " +
              " ".join(f"{t:.2f}" for t in times[s]))
    faster = sum(r < 1 for r in ratios)
    print(f"tuned / default per round: median {statistics.median(ratios):.3f} (faster in {faster} of "
          f"{len(ratios)} rounds); decode speed-up {1 / statistics.median(ratios):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
