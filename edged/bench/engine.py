"""In-process benchmarks of the engine on a loaded model: single-stream prefill/decode speed,
aggregate throughput / TTFT / inter-token latency vs concurrency, and prefix-cache TTFT."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np

from edged.bench.serve import percentiles
from edged.engine.engine import Engine, EngineConfig
from edged.engine.sizing import plan_kv
from edged.sampling import SamplingParams


def _prompt(vocab: int, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(100, min(vocab, 50_000), size=n).tolist()


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@dataclass
class RequestTiming:
    ttft_s: float
    itl_s: list
    n_out: int


def _consume(stream, t0: float, out: list, idx: int) -> None:
    first, last, itl = None, None, []
    n = 0
    for d in stream:
        now = time.perf_counter()
        if d.token_id is None:
            continue
        n += 1
        if first is None:
            first = now
        else:
            itl.append(now - last)
        last = now
        if d.finish_reason == "error":
            raise RuntimeError(d.error)
    out[idx] = RequestTiming(first - t0, itl, n)


def decode_after_first(streams, started=None) -> tuple[int, float]:
    """(tokens, seconds) generated once every stream has its first token, so prefill is excluded;
    `started` is called at that moment."""
    its = [iter(s) for s in streams]
    for it in its:
        next(it)
    if started is not None:
        started()
    t0 = time.perf_counter()
    n = 0
    for it in its:
        for d in it:
            if d.finish_reason == "error":
                raise RuntimeError(d.error)
            n += d.token_id is not None
    return n, time.perf_counter() - t0


def make_engine(lm, *, max_seqs: int, ctx: int, block_size: int = 16, max_batch_tokens: int = 512,
                prefix_cache: bool = True) -> Engine:
    kv = plan_kv(lm.model, block_size, ctx=ctx, max_seqs=max_seqs, max_batch_tokens=max_batch_tokens)
    cfg = EngineConfig.from_plan(kv, max_batch_tokens=max_batch_tokens, max_seqs=max_seqs,
                                 enable_prefix_cache=prefix_cache)
    return Engine(lm.model, lm.tokenizer, cfg).start()


def run_concurrent(engine: Engine, prompts: list[list[int]], gen: int) -> dict:
    """Submit all prompts at once; aggregate tokens/s, TTFT and ITL percentiles, KV efficiency."""
    results: list = [None] * len(prompts)
    ratios: list[float] = []
    done = threading.Event()

    def watch():  # KV bytes in use / bytes the held tokens need (per pool: all tokens for the
        # full-attention layers, the last window - 1 for sliding-window ones), sampled while running
        while not done.is_set():
            st = engine.stats()
            if st.kv_bytes_needed > 0:
                ratios.append(st.kv_bytes_used / st.kv_bytes_needed)
            time.sleep(0.005)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    t0 = time.perf_counter()
    streams = [engine.add_request(p, _greedy(gen)) for p in prompts]
    threads = [threading.Thread(target=_consume, args=(s, t0, results, i)) for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done.set()
    w.join()
    total = sum(r.n_out for r in results)
    ttft = percentiles([r.ttft_s for r in results])
    itl = percentiles([x for r in results for x in r.itl_s])
    kv = percentiles(ratios)
    nan = float("nan")
    return {"concurrency": len(prompts), "generated_tokens": total, "wall_s": wall,
            "tokens_per_s": total / wall, "ttft_p50_s": ttft["p50"], "ttft_p95_s": ttft["p95"],
            "itl_p50_s": nan if itl["p50"] is None else itl["p50"],
            "itl_p95_s": nan if itl["p95"] is None else itl["p95"],
            "kv_overhead_median": nan if kv["p50"] is None else kv["p50"],
            "kv_overhead_max": max(ratios, default=nan)}


def bench_single(lm, prompt_tokens=(128, 512), gen_tokens: int = 128, repeat: int = 5) -> dict:
    """Single stream: prefill tok/s per prompt length (TTFT-based) and decode tok/s; medians."""
    vocab = lm.model.vocab_size
    engine = make_engine(lm, max_seqs=1, ctx=max(prompt_tokens) + gen_tokens + 16)
    out = {"prefill": {}, "decode": {}}
    try:
        for p in prompt_tokens:
            pf, dec = [], []
            for r in range(repeat):
                res = run_concurrent(engine, [_prompt(vocab, p, 1000 * p + r)], gen_tokens)
                pf.append(p / res["ttft_p50_s"])
                dec.append(1.0 / res["itl_p50_s"] if res["itl_p50_s"] > 0 else float("nan"))
            out["prefill"][p] = _summary(pf)
            out["decode"][p] = _summary(dec)
    finally:
        engine.stop()
    return out


def bench_concurrency(lm, levels=(1, 4, 16), prompt_tokens: int = 128, gen_tokens: int = 128,
                      repeat: int = 3) -> list[dict]:
    """Aggregate decode throughput and latencies at each concurrency level (median of runs)."""
    vocab = lm.model.vocab_size
    rows = []
    for c in levels:
        engine = make_engine(lm, max_seqs=c, ctx=prompt_tokens + gen_tokens + 16)
        try:
            runs = [run_concurrent(engine, [_prompt(vocab, prompt_tokens, 7919 * r + i) for i in range(c)],
                                   gen_tokens) for r in range(repeat)]
        finally:
            engine.stop()
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "concurrency"}
        med["concurrency"] = c
        med["tokens_per_s_runs"] = [r["tokens_per_s"] for r in runs]
        rows.append(med)
    return rows


def bench_prefix_cache(lm, prefix_tokens: int = 1024, suffix_tokens: int = 16, repeat: int = 3) -> dict:
    """TTFT of a prompt whose first prefix_tokens were seen before vs the same prompt cold."""
    vocab = lm.model.vocab_size
    cold, warm = [], []
    for r in range(repeat):
        engine = make_engine(lm, max_seqs=2, ctx=prefix_tokens + suffix_tokens + 64)
        try:
            prefix = _prompt(vocab, prefix_tokens, 31 * r + 1)
            a = prefix + _prompt(vocab, suffix_tokens, 31 * r + 2)
            b = prefix + _prompt(vocab, suffix_tokens, 31 * r + 3)
            cold.append(run_concurrent(engine, [a], 1)["ttft_p50_s"])
            warm.append(run_concurrent(engine, [b], 1)["ttft_p50_s"])
        finally:
            engine.stop()
    c, w = statistics.median(cold), statistics.median(warm)
    return {"prefix_tokens": prefix_tokens, "cold_ttft_s": c, "hit_ttft_s": w, "ratio": w / c}


def _summary(xs) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs)}


def step_breakdown(lm, levels=(1, 4, 16), prompt_tokens: int = 32, gen_tokens: int = 64,
                   repeat: int = 3, clock: str = "wall") -> list[dict]:
    """Decode-step time split into phases and ops (ms per step, median of `repeat` runs) at each
    concurrency level. Prompts are short so every request is prefilled in the first step; only
    the steps after every request has its first token are counted."""
    from edged.bench.profile import StepProfiler

    vocab = lm.model.vocab_size
    rows = []
    for c in levels:
        engine = make_engine(lm, max_seqs=c, ctx=prompt_tokens + gen_tokens + 16,
                             max_batch_tokens=max(512, c * prompt_tokens))
        prof = StepProfiler(clock).attach(engine)
        runs = []
        try:
            for r in range(repeat + 1):  # the first run warms up
                streams = [engine.add_request(_prompt(vocab, prompt_tokens, 7919 * r + i), _greedy(gen_tokens))
                           for i in range(c)]
                n, wall = decode_after_first(streams, started=prof.reset)
                if r == 0:
                    continue
                ms = prof.per_step_ms()
                ms["wall per step"] = wall * 1e3 / max(prof.steps, 1)
                ms["tokens_per_s"] = n / wall
                ms["steps"] = prof.steps
                runs.append(ms)
        finally:
            prof.detach()
            engine.stop()
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        med["concurrency"] = c
        rows.append(med)
    return rows


def format_breakdown(rows: list[dict]) -> str:
    """One column per concurrency level, one row per phase (ms per decode step)."""
    keys = [k for k in rows[0] if k not in ("concurrency", "tokens_per_s", "steps")]
    head = f"{'ms per decode step':<20}" + "".join(f"{'c=' + str(r['concurrency']):>10}" for r in rows)
    lines = [head]
    for k in keys:
        lines.append(f"{k:<20}" + "".join(f"{r[k]:>10.3f}" for r in rows))
    lines.append(f"{'tokens/s':<20}" + "".join(f"{r['tokens_per_s']:>10.1f}" for r in rows))
    return "\n".join(lines)
