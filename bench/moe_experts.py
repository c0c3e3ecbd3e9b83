"""The experts of a MoE file's layers at decode, on their own: one token, k random experts a layer,
every layer in turn (weights read cold, as in a decode step), through the CPU backend's two paths:
moe_matmul + silu_mul + moe_matmul + moe_combine (general) and moe_ffn_step (one call). The
stacks are placed as the host places them (for_matmul: row pairs for the K-quants). Prints the
median milliseconds for all layers and the experts' read rate; the outputs are checked equal.

Usage: python bench/moe_experts.py MOE.gguf [--rounds 40]   (a file from bench/synth_moe.py)
"""

import argparse
import statistics
import sys
import time

import numpy as np

import edged.backends.cpu as cpu  # first: edged configures numba before its import
from edged.backends.cpu.moe_route import route_groups
from edged.quant.gguf import load_gguf

mm = sys.modules["edged.backends.cpu.matmul"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args()
    gf = load_gguf(a.model)  # kept open: a weight the host does not copy stays the file's mapping
    k_used = gf.get_int(gf.arch_key("expert_used_count"))
    names = [t for t in gf.tensors if t.endswith("ffn_gate_exps.weight")]
    layers = [tuple(mm.for_matmul(gf.tensors[n.replace("gate", w)]) for w in ("gate", "up", "down"))
              for n in names]
    n_expert, _, d = layers[0][0].shape
    nbytes = sum(w.data.nbytes // n_expert * k_used for ws in layers for w in ws)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((1, d)).astype(np.float32)

    def general(g, u, dn, w, tok, ex, cuts, src):
        a_, b_ = cpu.moe_matmul((g, u), h, tok, ex, cuts)
        y, = cpu.moe_matmul((dn,), cpu.silu_mul(a_, b_), np.arange(len(tok), dtype=np.int32), ex, cuts)
        return cpu.moe_combine([y], src, w)

    def fused(g, u, dn, w, tok, ex, cuts, src):
        return cpu.moe_ffn_step(g, u, dn, h, tok, ex, cuts, src, w, "silu")

    times = {"general": [], "moe_ffn_step": []}
    for r in range(a.rounds + 3):
        routes = [route_groups(rng.standard_normal((1, n_expert)).astype(np.float32), k_used, "softmax", True)[1:]
                  for _ in layers]
        outs = {}
        for name, fn in (("general", general), ("moe_ffn_step", fused))[:: 1 if r % 2 else -1]:
            t0 = time.perf_counter()
            outs[name] = [fn(*ws, *route) for ws, route in zip(layers, routes)]
            if r >= 3:
                times[name].append(time.perf_counter() - t0)
        assert all(np.array_equal(x, y) for x, y in zip(outs["general"], outs["moe_ffn_step"]))
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:13s} {len(layers)} layers: {t * 1e3:.2f} ms  ({nbytes / t / 1e9:.1f} GB/s of experts)")


if __name__ == "__main__":
    main()
