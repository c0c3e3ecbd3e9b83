"""Prefill and decode tokens/s of the default model (or a same-shape synthetic one) on the CPU,
fully offloaded to the GPU, and hybrid at several --gpu-layers, written as one JSON file.

Times the model's forward pass directly (no tokenizer or server), so it runs where only the
model file and edged's kernels exist. On a machine without a usable CUDA device it says so and
measures the CPU alone.

Usage: python bench/gpu_bench.py [--model PATH] [--gpu-layers 6,12,all] [--prompt 512] [--gen 64]
                                 [--repeat 3] [--out FILE.json]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from edged.backends.base import Batch
from edged.backends.cuda.probe import probe
from edged.models import load_model
from edged.offload import apply, plan
from edged.quant import load_gguf


def _model_path(arg: str | None) -> tuple[str, str]:
    """(path, what it is): the given file, the installed default model, or a synthetic twin."""
    if arg:
        return arg, "given"
    try:
        from edged.model_path import resolve_reference_model

        return str(resolve_reference_model()), "default model"
    except Exception:
        sys.path.insert(0, os.path.dirname(__file__))
        from synth_gemma3 import write

        path = os.path.join(tempfile.gettempdir(), "edged-synth-gemma3-270m.gguf")
        if not os.path.exists(path):
            write(path)
        return path, "synthetic twin of the default model (random weights, same shapes and types)"


def measure(gf, backend: str, gpu_layers, prompt: int, gen: int, repeat: int) -> dict:
    model = load_model(gf)
    bs = 16
    n_blocks = -(-(prompt + gen) // bs) + 1
    p = plan(model, backend, gpu_layers, kv_tokens=n_blocks * bs, batch_tokens=prompt)
    apply(model, p)
    kv = model.allocate_kv(n_blocks, bs)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.vocab_size, prompt + gen).astype(np.int32)
    model.forward(Batch.single(ids[:17], 0, n_blocks, bs), kv)  # compile / warm every path
    model.forward(Batch.single(ids[:1], 17, n_blocks, bs), kv)
    prefill, decode = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        model.forward(Batch.single(ids[:prompt], 0, n_blocks, bs), kv)
        t1 = time.perf_counter()
        for i in range(gen):
            model.forward(Batch.single(ids[prompt + i : prompt + i + 1], prompt + i, n_blocks, bs), kv)
        t2 = time.perf_counter()
        prefill.append(prompt / (t1 - t0))
        decode.append(gen / (t2 - t1))
    return {"backend": p.backend, "gpu_layers": p.gpu_layers, "output_on_gpu": p.output_on_gpu,
            "placement": p.describe(), "prefill_tok_s": statistics.median(prefill),
            "decode_tok_s": statistics.median(decode), "prefill_runs": prefill, "decode_runs": decode}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--gpu-layers", default="6,12,all", help="hybrid splits to measure; all = full offload")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results/gpu_check.json")
    a = ap.parse_args(argv)
    path, what = _model_path(a.model)
    gf = load_gguf(path)
    dev = probe()
    result = {"model": path, "model_kind": what, "device": dev.describe(), "gpu": dev.usable,
              "prompt_tokens": a.prompt, "gen_tokens": a.gen, "repeat": a.repeat, "configs": {}}
    configs = [("cpu", "cpu", 0)]
    if dev.usable:
        for spec in a.gpu_layers.split(","):
            n = 10**6 if spec.strip() == "all" else int(spec)
            configs.append((f"gpu_layers={spec.strip()}", "cuda", n))
    else:
        print(f"gpu_bench: {dev.describe()} — measuring the CPU only", file=sys.stderr)
    for name, backend, n in configs:
        r = measure(gf, backend, n, a.prompt, a.gen, a.repeat)
        result["configs"][name] = r
        print(f"{name:<18} prefill {r['prefill_tok_s']:9.1f} tok/s   decode {r['decode_tok_s']:8.1f} tok/s"
              f"   ({r['placement']})", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: (v["prefill_tok_s"], v["decode_tok_s"]) for k, v in result["configs"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
