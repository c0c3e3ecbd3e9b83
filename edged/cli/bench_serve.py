"""`edged bench serve --url URL`: the load generator for OpenAI-compatible servers.

`edged bench` itself takes a MODEL argument, so it cannot be a plain click group (the group would
read `serve` as the model). BenchCommand keeps `edged bench [MODEL] --kernels ...` unchanged and
hands `edged bench serve ...` to the command here.
"""

from __future__ import annotations

import click


def _levels(value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected a comma-separated list of integers, got {value!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise click.BadParameter("concurrency levels must be >= 1")
    return levels


@click.command("serve")
@click.option("--url", required=True, help="Server base URL, e.g. http://127.0.0.1:8080 (no /v1).")
@click.option("--concurrency", default="1,4,16", show_default=True,
              help="Comma-separated concurrency levels, run in turn.")
@click.option("--requests", "n_requests", type=click.IntRange(1), default=None,
              help="Requests per level (default: 2 x concurrency, at least 4).")
@click.option("--prompt-tokens", type=click.IntRange(1), default=128, show_default=True,
              help="Prompt length in words (about one token each).")
@click.option("--gen-tokens", type=click.IntRange(1), default=64, show_default=True,
              help="Tokens generated per request (ignore_eos).")
@click.option("--shared-prefix-tokens", type=click.IntRange(0), default=0, show_default=True,
              help="Leading words common to every prompt (exercises prefix caching).")
@click.option("--api-key", envvar="EDGED_API_KEY", default=None, help="Bearer key, if the server needs one.")
@click.option("--model", default=None, help="`model` field to send (default: none).")
@click.option("--no-warmup", is_flag=True, help="Skip the untimed warm-up request.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(url, concurrency, n_requests, prompt_tokens, gen_tokens, shared_prefix_tokens,
            api_key, model, no_warmup, as_json):
    """Drive an OpenAI-compatible server with streaming /v1/completions requests and report
    throughput, TTFT and inter-token latency (p50/p95/p99) and errors per concurrency level."""
    from edged.bench import serve as bench_serve

    levels = _levels(concurrency)
    if shared_prefix_tokens > prompt_tokens:
        raise click.BadParameter("--shared-prefix-tokens must be <= --prompt-tokens")
    results = bench_serve.run(url, levels, requests=n_requests, prompt_tokens=prompt_tokens,
                              gen_tokens=gen_tokens, shared_prefix_tokens=shared_prefix_tokens,
                              api_key=api_key, model=model, warmup=not no_warmup)
    click.echo(bench_serve.as_json(results) if as_json else bench_serve.format_table(results))
    if all(r.errors == r.requests for r in results):
        raise SystemExit(1)


class BenchCommand(click.Command):
    """`edged bench` with one subcommand, `serve`, ahead of its own MODEL argument."""

    SUBCOMMANDS = {"serve": command}

    def parse_args(self, ctx, args):
        if args and args[0] in self.SUBCOMMANDS:
            ctx.meta["edged.bench.sub"] = (args[0], list(args[1:]))
            return []
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        sub = ctx.meta.get("edged.bench.sub")
        if sub is None:
            return super().invoke(ctx)
        name, args = sub
        cmd = self.SUBCOMMANDS[name]
        # parented to `edged`, named "bench serve": usage reads `edged bench serve`, not `[MODEL] serve`
        with cmd.make_context(f"{ctx.info_name} {name}", args, parent=ctx.parent) as sub_ctx:
            return cmd.invoke(sub_ctx)

    def format_epilog(self, ctx, formatter):
        super().format_epilog(ctx, formatter)
        with formatter.section("Subcommands"):
            formatter.write_dl([(n, c.get_short_help_str()) for n, c in self.SUBCOMMANDS.items()])
