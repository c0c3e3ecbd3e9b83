#!/usr/bin/env python3
"""edged on the default model with K-quant matmuls fed llama.cpp's Q8_K activation grid instead of
the per-32 one: teacher-forced agreement with llama.cpp's reference and (--ppl) perplexity.

The grid is switched by wrapping backends/cpu/matmul.matmul in this process (matmul.py picks the
per-32 grid for every type); nothing in the package changes.

    .venv/bin/python bench/q8k_activations_check.py [--grid q8_32|q8_K] [--ppl]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import edged  # noqa: F401,E402  (numba settings first)
import numpy as np  # noqa: E402

KQUANTS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}


def use_grid(grid: str) -> None:
    """Make the CPU backend's matmul quantize K-quant activations on `grid`."""
    import importlib

    import edged.backends.cpu as cpu

    mm = importlib.import_module("edged.backends.cpu.matmul")  # the attribute is the function
    from edged.backends.cpu.act_quant import quantize_activations
    from edged.quant.types import traits

    plain = mm.matmul

    def matmul(w, x, *, qx=None, out=None):
        if qx is None and traits(w.qtype).qtype.name in KQUANTS:
            qx = quantize_activations(np.ascontiguousarray(x, dtype=np.float32), grid=grid)
        return plain(w, x, qx=qx, out=out)

    cpu.matmul = mm.matmul = matmul


def teacher_forced(model) -> str:
    from tests.helpers.model import llamacpp_reference
    from tests.models.driver import Seq, ShuffledBlocks, log_softmax, make_batch

    cases = llamacpp_reference()["greedy"]
    bs = 16
    seqs = [c["prompt_ids"] + c["ids"][:-1] for c in cases]
    n_blocks = sum(-(-len(s) // bs) for s in seqs)
    kv = model.allocate_kv(n_blocks, bs)
    batch = make_batch([Seq() for _ in seqs], seqs, ShuffledBlocks(n_blocks), bs, all_logits=True)
    logits = model.forward(batch, kv)  # [sum of lengths, vocab]
    agree, diffs, whole = 0, [], 0
    for s, case in enumerate(cases):
        row0 = int(batch.seq_starts[s]) + len(case["prompt_ids"]) - 1
        ok = True
        for i, step in enumerate(case["steps"]):
            lp = log_softmax(logits[row0 + i])
            hit = int(np.argmax(lp)) == step["top"][0][0]
            agree, ok = agree + hit, ok and hit
            diffs.append(abs(lp[step["top"][0][0]] - step["top"][0][1]))
        whole += ok
    d = np.array(diffs)
    return (f"cases with all 32 top-1s equal {whole}/12, top-1 agree {agree}/{len(d)}, "
            f"mean |diff| {d.mean():.4f}, p90 {np.quantile(d, 0.9):.3f}, max {d.max():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="q8_K", choices=["q8_32", "q8_K"])
    ap.add_argument("--ppl", action="store_true", help="also llama.cpp-style perplexity (slow)")
    args = ap.parse_args()
    use_grid(args.grid)
    from edged.models import load_model
    from edged.quant import load_gguf
    from tests.helpers.model import default_model_path

    t0 = time.time()
    model = load_model(load_gguf(default_model_path()))
    print(f"grid {args.grid}: teacher-forced {teacher_forced(model)} ({time.time() - t0:.0f} s)", flush=True)
    if args.ppl:
        from edged.loader import load
        from edged.perplexity import perplexity

        lm = load(None, kv_tokens=512, batch_tokens=512)
        text = (ROOT / "tests" / "fixtures" / "ppl_text_gpl3.txt").read_text()
        tokens = lm.tokenizer.encode(text, add_special=True, parse_special=False)
        last = None
        for last in perplexity(lm.model, tokens, lm.tokenizer.bos_id, ctx=512):
            pass
        print(f"grid {args.grid}: PPL {last.ppl:.4f} (llama.cpp 13.9062)", flush=True)


if __name__ == "__main__":
    main()
