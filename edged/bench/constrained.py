"""Constrained vs unconstrained decoding through the engine, in the same run: decode tokens/s at
each concurrency level with and without a JSON schema (runs interleaved, so machine noise hits
both alike), the engine's mask time per step (computed on the worker thread during the forward
pass), and llguidance's per-token mask time on the model's vocabulary (edged.bench.structured).

The schema is an array of at least 64 BENCH_SCHEMA orders, so a constrained request cannot end
before max_tokens and both kinds generate the same number of tokens.
"""

from __future__ import annotations

import statistics
import time

from edged.bench.engine import _prompt, decode_after_first, make_engine
from edged.bench.serve import percentiles
from edged.bench.structured import BENCH_SCHEMA, cpu_model
from edged.sampling import SamplingParams

LONG_SCHEMA = {"type": "array", "items": BENCH_SCHEMA, "minItems": 64}


def _decode_run(engine, prompts, gen: int, constraints) -> tuple[float, int]:
    """Decode tokens/s once every request has its first token (prefill excluded)."""
    params = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True)
    streams = [engine.add_request(p, params, constraint=c) for p, c in zip(prompts, constraints)]
    n, seconds = decode_after_first(streams)
    return n / seconds, n


def bench_constrained(lm, levels=(1, 8), gen_tokens: int = 64, prompt_tokens: int = 32,
                      repeat: int = 3, schema=None) -> dict:
    from edged.engine.constraint import ModelGrammars
    from edged.structured import schema_constraint

    t0 = time.perf_counter()
    grammars = ModelGrammars(lm.tokenizer, lm.model.vocab_size)
    build_s = time.perf_counter() - t0
    constraint = schema_constraint(schema or LONG_SCHEMA, "bench")
    vocab = lm.model.vocab_size
    rows = []
    for c in levels:
        engine = make_engine(lm, max_seqs=c, ctx=prompt_tokens + gen_tokens + 16)
        free, con = [], []
        try:
            for r in range(repeat + 1):  # the first round warms up
                prompts = [_prompt(vocab, prompt_tokens, 7919 * r + i) for i in range(c)]
                a, _ = _decode_run(engine, prompts, gen_tokens, [None] * c)
                engine.masks.timings.clear()
                b, _ = _decode_run(engine, prompts, gen_tokens,
                                   [grammars.request_constraint(constraint) for _ in range(c)])
                if r:
                    free.append(a)
                    con.append(b)
            steps = list(engine.masks.timings)
        finally:
            engine.stop()
        mask_ms = percentiles([s * 1e3 for s, _ in steps])
        per_row = percentiles([s * 1e3 / n for s, n in steps if n])
        rows.append({"concurrency": c, "unconstrained_tok_s": statistics.median(free),
                     "constrained_tok_s": statistics.median(con),
                     "ratio": statistics.median(con) / statistics.median(free),
                     "ratio_runs": [b / a for a, b in zip(free, con)],
                     "mask_step_ms_p50": mask_ms["p50"], "mask_step_ms_p99": mask_ms["p99"],
                     "mask_per_token_ms_p50": per_row["p50"], "mask_per_token_ms_p99": per_row["p99"]})
    return {"cpu": cpu_model(), "lltokenizer_build_s": build_s, "gen_tokens": gen_tokens,
            "levels": rows}


def llguidance_mask_times(model_path=None) -> dict:
    """Per-token fill_mask wall time (ms, p50/p99) walking the bench schema (edged.bench.structured)."""
    from edged.bench import structured

    r = structured.run(model_path, n_sampled=2, kernel_repeat=40)
    return {"fill_mask_per_token_wall": r["fill_mask_per_token_wall"], "kernel_1row": r["kernel_1row"],
            "vocab": r["vocab"]}


def format_constrained(report: dict) -> str:
    lines = [f"CPU: {report['cpu']}",
             f"{'conc':>4} {'free tok/s':>11} {'json tok/s':>11} {'ratio':>6} "
             f"{'mask/step p50':>14} {'p99 ms':>7}"]
    for r in report["levels"]:
        lines.append(f"{r['concurrency']:>4} {r['unconstrained_tok_s']:>11.1f} {r['constrained_tok_s']:>11.1f} "
                     f"{r['ratio']:>6.3f} {r['mask_step_ms_p50']:>14.3f} {r['mask_step_ms_p99']:>7.3f}")
    m = report.get("llguidance")
    if m:
        f = m["fill_mask_per_token_wall"]
        lines.append(f"llguidance mask per token ({m['vocab']} tokens): p50 {f['p50_ms']:.3f} ms, "
                     f"p99 {f['p99_ms']:.3f} ms")
    return "\n".join(lines)
