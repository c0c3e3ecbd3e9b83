"""`edged bench [MODEL] [--kernels] [--concurrency L] [--prefix-cache] [--breakdown L] [--json]`:
performance measurements.

Each measurement family is one flag backed by an importable module (edged.bench.kernels, edged.bench.engine);
model benchmarks join as further flags that add sections to the same report.
"""

from __future__ import annotations

import json

import click

from edged.cli.bench_serve import BenchCommand
from edged.cli.options import backend_options, kv_type_option, model_argument


def _kernels_section(model, repeat: int, bw_mib: int, as_json: bool, clock: str, retune: bool = False,
                     tune_budget: float | None = None) -> dict:
    from edged.bench import kernels as bench_kernels
    from edged.model_path import resolve_model_path

    path = resolve_model_path(model)
    # the table streams row by row (to stderr under --json, whose stdout is the JSON alone)
    return bench_kernels.run(path, repeat=repeat, bw_bytes=bw_mib << 20, log=lambda s: click.echo(s, err=as_json),
                             clock=clock, retune=retune, tune_budget=tune_budget)


@click.command("bench", cls=BenchCommand)  # `edged bench serve ...`: the HTTP load generator
@model_argument
@click.option("--kernels", is_flag=True, help="Matmul kernels of every type at n=1 and n=16 vs bandwidth and BLAS, "
              "and the kernel variants chosen for this CPU.")
@click.option("--retune", is_flag=True, help="With --kernels: time every kernel variant again (as EDGED_TUNE=force "
              "does at load) and rewrite the tuning cache.")
@click.option("--tune-budget", type=click.FloatRange(0), default=None,
              help="Seconds the kernel tuning may spend [default: EDGED_TUNE_BUDGET_S or 10].")
@click.option("--repeat", type=click.IntRange(1), default=5, show_default=True, help="Runs per figure (median).")
@click.option("--bandwidth-mib", type=click.IntRange(64), default=1024, show_default=True,
              help="Size of the streaming-read buffer that measures memory bandwidth.")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="wall: elapsed time; cpu: process CPU time for --kernels, the engine thread's for "
                   "--breakdown (steadier on a busy machine; use with NUMBA_NUM_THREADS=1 "
                   "OPENBLAS_NUM_THREADS=1 for per-core cost).")
@click.option("--prompt-tokens", default="128,512", show_default=True,
              help="Single-stream prefill lengths (comma-separated).")
@click.option("--gen-tokens", type=click.IntRange(2), default=128, show_default=True,
              help="Tokens generated per request.")
@click.option("--concurrency", default=None,
              help="Aggregate throughput / TTFT / ITL at these concurrency levels, e.g. 1,4,16.")
@click.option("--prefix-cache", "prefix_cache", is_flag=True,
              help="TTFT of a prompt whose first 1024 tokens were seen before vs cold.")
@click.option("--breakdown", default=None,
              help="Decode-step time per phase and op (ms per step) at these concurrency levels, "
                   "e.g. 1,4,16 (32-token prompts, 64 generated tokens each).")
@click.option("--structured", is_flag=True,
              help="Decode tokens/s under a JSON schema vs unconstrained (interleaved runs) at "
                   "--concurrency levels (default 1,8), and the grammar mask time per token.")
@click.option("--embeddings", is_flag=True,
              help="Embedding inputs/s through the engine for --concurrency concurrent inputs "
                   "(default 16) of the first --prompt-tokens length (128 unless given).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@backend_options
@kv_type_option
def command(model, kernels, retune, tune_budget, repeat, bandwidth_mib, clock, prompt_tokens, gen_tokens, concurrency,
            prefix_cache, breakdown, structured, embeddings, as_json, backend, gpu_layers, kv_type):
    """Benchmark edged on this machine (MODEL: a .gguf path; default: the reference model, Gemma 3
    270M Q4_K_M, that docs/BENCHMARKS.md records, not the chat model `edged serve` picks).

    Without a section flag: single-stream prefill and decode tokens/s (median and spread of
    --repeat runs) through the engine."""
    if (retune or tune_budget is not None) and not kernels:
        raise click.UsageError("--retune and --tune-budget go with --kernels (at load: EDGED_TUNE=force, "
                               "EDGED_TUNE_BUDGET_S)")
    if model is None:  # the figures in docs/BENCHMARKS.md are Gemma's, whatever the store holds
        from edged.model_path import resolve_reference_model

        model = str(resolve_reference_model())
    report = {}
    if kernels:
        report["kernels"] = _kernels_section(model, repeat, bandwidth_mib, as_json, clock, retune, tune_budget)
    if structured:
        report["structured"] = _structured_section(model, concurrency, gen_tokens, repeat, as_json,
                                                   backend, gpu_layers, kv_type)
        concurrency = None  # its levels were the structured section's
    if embeddings:
        report["embeddings"] = _embeddings_section(model, concurrency, prompt_tokens, repeat, as_json,
                                                   backend, gpu_layers, kv_type)
        concurrency = None  # its levels were the embeddings section's
    if (not kernels and not structured and not embeddings) or concurrency or prefix_cache or breakdown:
        report.update(_model_sections(model, repeat, prompt_tokens, gen_tokens, concurrency,
                                      prefix_cache, breakdown, kernels, as_json, backend, gpu_layers, clock,
                                      kv_type))
    if as_json:
        click.echo(json.dumps(report, indent=2))


def _structured_section(model, concurrency, gen_tokens, repeat, as_json, backend, gpu_layers, kv_type) -> dict:
    from edged.bench import constrained
    from edged.loader import load

    levels = _levels(concurrency) or [1, 8]
    gen = min(gen_tokens, 96)
    lm = load(model, quiet=as_json, backend=backend, gpu_layers=gpu_layers,
              kv_tokens=max(levels) * (32 + gen + 16) + 2048, kv_type=kv_type)
    report = constrained.bench_constrained(lm, levels, gen, repeat=max(1, min(repeat, 3)))
    report["llguidance"] = constrained.llguidance_mask_times(model)
    (click.echo if not as_json else lambda s: click.echo(s, err=True))(
        constrained.format_constrained(report))
    return report


def _embeddings_section(model, concurrency, prompt_tokens, repeat, as_json, backend, gpu_layers, kv_type) -> dict:
    from edged.bench import embeddings as bench_embeddings
    from edged.loader import load

    try:
        levels = _levels(concurrency) or [16]
        length = (_levels(prompt_tokens) or [128])[0]
    except ValueError:
        raise click.UsageError("--concurrency and --prompt-tokens take comma-separated integers") from None
    try:
        lm = load(model, quiet=as_json, backend=backend, gpu_layers=gpu_layers,
                  kv_tokens=max(levels) * (length + 16) + 2048, kv_type=kv_type)
    except ValueError as e:  # OffloadError, GGUFError
        raise click.ClickException(str(e)) from None
    rows = bench_embeddings.bench_embeddings(lm, levels, length, repeat=max(1, min(repeat, 3)))
    (click.echo if not as_json else lambda s: click.echo(s, err=True))(bench_embeddings.format_embeddings(rows))
    return {"placement": lm.placement.describe(), "levels": rows}


def _levels(value) -> list[int]:
    return [int(x) for x in value.split(",") if x] if value else []


def _model_sections(model, repeat, prompt_tokens, gen_tokens, concurrency, prefix_cache, breakdown,
                    kernels_too, as_json, backend="auto", gpu_layers="auto", clock="wall",
                    kv_type="f16") -> dict:
    from edged.bench import engine as bench_engine
    from edged.loader import load

    try:
        plens, levels, steps_at = _levels(prompt_tokens), _levels(concurrency), _levels(breakdown)
    except ValueError:
        raise click.UsageError("--prompt-tokens, --concurrency and --breakdown take comma-separated "
                               "integers") from None
    say = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    try:
        lm = load(model, quiet=as_json, backend=backend, gpu_layers=gpu_layers,
                  kv_tokens=max(levels + steps_at or [1]) * (max(plens, default=512) + gen_tokens + 16) + 2048,
                  kv_type=kv_type)
    except ValueError as e:  # OffloadError, GGUFError
        raise click.ClickException(str(e)) from None
    out = {"placement": lm.placement.describe(), "kv_type": kv_type}
    if not (kernels_too or levels or prefix_cache or steps_at):
        r = bench_engine.bench_single(lm, plens, gen_tokens, repeat)
        out["single"] = r
        say(f"{'single stream':<16}{'median tok/s':>14}{'min':>10}{'max':>10}")
        for p in plens:
            for kind in ("prefill", "decode"):
                f = r[kind][p]
                say(f"{kind + ' ' + str(p):<16}{f['median']:>14.1f}{f['min']:>10.1f}{f['max']:>10.1f}")
    if levels:
        rows = bench_engine.bench_concurrency(lm, levels, plens[0], gen_tokens, max(1, min(repeat, 3)))
        out["concurrency"] = rows
        say(f"{'conc':>4} {'tok/s':>8} {'ttft p50':>9} {'p95':>7} {'itl p50':>8} {'p95':>7} {'kv overhead':>12}")
        for r in rows:
            say(f"{r['concurrency']:>4} {r['tokens_per_s']:>8.1f} {r['ttft_p50_s'] * 1e3:>9.0f} "
                f"{r['ttft_p95_s'] * 1e3:>7.0f} {r['itl_p50_s'] * 1e3:>8.1f} {r['itl_p95_s'] * 1e3:>7.1f} "
                f"{r['kv_overhead_median']:>12.3f}")
    if prefix_cache:
        r = bench_engine.bench_prefix_cache(lm, repeat=max(1, min(repeat, 3)))
        out["prefix_cache"] = r
        say(f"prefix cache: cold TTFT {r['cold_ttft_s'] * 1e3:.0f} ms, hit TTFT "
            f"{r['hit_ttft_s'] * 1e3:.0f} ms, ratio {r['ratio']:.3f} ({r['prefix_tokens']}-token prefix)")
    if steps_at:
        rows = bench_engine.step_breakdown(lm, steps_at, repeat=repeat, clock="thread" if clock == "cpu" else clock)
        out["breakdown"] = rows
        say(bench_engine.format_breakdown(rows))
    return out
