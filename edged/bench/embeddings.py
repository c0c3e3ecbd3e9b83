"""`edged bench --embeddings`: embedding throughput through the engine, inputs/s for N concurrent
inputs of a given length (all submitted at once, as N clients would), median of runs."""

from __future__ import annotations

import statistics
import time

from edged.bench.engine import _prompt, make_engine
from edged.engine.pooling import pooling_for


def _run(engine, prompts: list[list[int]], pooling: str) -> float:
    """Seconds until every input's embedding is back."""
    t0 = time.perf_counter()
    streams = [engine.add_embedding(p, pooling) for p in prompts]
    for s in streams:
        for d in s:
            if d.finish_reason != "stop":
                raise RuntimeError(f"embedding ended with {d.finish_reason}: {d.error}")
    return time.perf_counter() - t0


def bench_embeddings(lm, levels=(16,), input_tokens: int = 128, repeat: int = 3,
                     max_batch_tokens: int = 512) -> list[dict]:
    """Per concurrency level: inputs/s and tokens/s (medians of `repeat` runs after one warm-up),
    pooling as the server would choose it without --pooling."""
    vocab = lm.model.vocab_size
    pt = lm.model.hparams.pooling_type
    pooling = pooling_for(pt if pt in (1, 2, 3) else None, None)  # a file's none/rank: mean
    rows = []
    for c in levels:
        engine = make_engine(lm, max_seqs=c, ctx=input_tokens + 16, max_batch_tokens=max_batch_tokens,
                             prefix_cache=False)
        try:
            _run(engine, [_prompt(vocab, input_tokens, 17 + i) for i in range(c)], pooling)  # warm-up
            walls = [_run(engine, [_prompt(vocab, input_tokens, 7919 * (r + 1) + i) for i in range(c)], pooling)
                     for r in range(repeat)]
        finally:
            engine.stop()
        rates = [c / w for w in walls]
        rows.append({"concurrency": c, "input_tokens": input_tokens, "pooling": pooling,
                     "inputs_per_s": statistics.median(rates), "inputs_per_s_runs": rates,
                     "tokens_per_s": statistics.median(rates) * input_tokens})
    return rows


def format_embeddings(rows: list[dict]) -> str:
    lines = [f"{'embeddings':<12}{'inputs':>8}{'tokens each':>13}{'inputs/s':>10}{'tokens/s':>10}"]
    for r in rows:
        lines.append(f"{r['pooling']:<12}{r['concurrency']:>8}{r['input_tokens']:>13}"
                     f"{r['inputs_per_s']:>10.1f}{r['tokens_per_s']:>10.0f}")
    return "\n".join(lines)
