"""`edged bench [MODEL] --kernels [--repeat N] [--json]`: performance measurements.

Each measurement family is one flag backed by an importable module (kernels: edged.bench_kernels);
model benchmarks join as further flags that add sections to the same report.
"""

from __future__ import annotations

import json

import click

from edged.cli.bench_serve import BenchCommand
from edged.cli.options import model_argument


def _kernels_section(model, repeat: int, bw_mib: int, as_json: bool, clock: str) -> dict:
    from edged import bench_kernels
    from edged.model_path import resolve_model_path

    path = resolve_model_path(model)
    # the table streams row by row (to stderr under --json, whose stdout is the JSON alone)
    return bench_kernels.run(path, repeat=repeat, bw_bytes=bw_mib << 20, log=lambda s: click.echo(s, err=as_json),
                             clock=clock)


@click.command("bench", cls=BenchCommand)  # `edged bench serve ...`: the HTTP load generator
@model_argument
@click.option("--kernels", is_flag=True, help="Matmul kernels of every type at n=1 and n=16 vs bandwidth and BLAS.")
@click.option("--repeat", type=click.IntRange(1), default=5, show_default=True, help="Runs per figure (median).")
@click.option("--bandwidth-mib", type=click.IntRange(64), default=1024, show_default=True,
              help="Size of the streaming-read buffer that measures memory bandwidth.")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="wall: elapsed time; cpu: process CPU time (steadier on a busy machine; use with "
                   "NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 for per-core kernel cost).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def command(model, kernels, repeat, bandwidth_mib, clock, as_json):
    """Benchmark edged on this machine (MODEL: a .gguf path; default: the default model)."""
    if not kernels:
        raise click.UsageError("choose what to benchmark: --kernels")
    report = {}
    if kernels:
        report["kernels"] = _kernels_section(model, repeat, bandwidth_mib, as_json, clock)
    if as_json:
        click.echo(json.dumps(report, indent=2))
