#!/usr/bin/env python3
"""Which of llama.cpp's roundings make a forward reproduce its greedy tokens on the default model?

Runs tests/models/llamacpp_emulation.py teacher-forced on the 12 reference prompts (each prompt
followed by llama.cpp's 32 tokens) with llama.cpp's roundings switched on one at a time, all
together, and all-but-one. A case matches when every step's argmax equals llama.cpp's token, which
is exactly when greedy decoding reproduces its 32 tokens.

    .venv/bin/python bench/llamacpp_numerics.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.model import default_model_path, llamacpp_reference  # noqa: E402
from tests.models.llamacpp_emulation import LLAMACPP, Emulator, Numerics, score_teacher_forced  # noqa: E402

OFF = {"act": "f32", "f32": False, "norm": "f64", "rope": "exact", "gelu": "exact", "kv_f16": False, "fa": "exact"}


def variants() -> dict:
    full = dataclasses.asdict(LLAMACPP)
    out = {"float64": Numerics(), "llama.cpp (all)": LLAMACPP, "act=q8_0 only (all per-32)": Numerics(act="q8_0"),
           "act=q8_0 + the rest": dataclasses.replace(LLAMACPP, act="q8_0"),
           "all, matmuls in float32": dataclasses.replace(LLAMACPP, mm32=True)}
    for k in (k for k in full if k != "mm32"):
        out[f"only {k}"] = Numerics(**{k: full[k]})
        out[f"all but {k}"] = dataclasses.replace(LLAMACPP, **{k: OFF[k]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    args = ap.parse_args()
    t0 = time.time()
    emu = Emulator(default_model_path())
    print(f"weights loaded in {time.time() - t0:.0f} s", flush=True)
    cases = llamacpp_reference()["greedy"]
    for name, nm in variants().items():
        if args.only and name not in args.only:
            continue
        t0 = time.time()
        r = score_teacher_forced(lambda seq: emu.logits(seq, nm), cases)
        print(f"{name:28s} match {r['matched']:2d}/12  worst {r['worst']:.3f}  teacher-forced: top-1 agree "
              f"{r['agree']}/384, mean |diff| {r['mean']:.4f}, p90 {r['p90']:.3f}  ({time.time() - t0:.0f} s)  "
              f"{r['detail']}", flush=True)


if __name__ == "__main__":
    main()
