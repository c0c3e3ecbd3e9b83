"""`edged perplexity`: llama.cpp-compatible perplexity of a model on a text file."""

from __future__ import annotations

import json
import time

import click

from edged.cli.options import backend_options, kv_type_option


@click.command("perplexity")
@click.argument("paths", nargs=-1, required=True, metavar="[MODEL] FILE")
@click.option("--ctx", type=int, default=512, show_default=True, help="Chunk length in tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@backend_options
@kv_type_option
def command(paths, ctx, as_json, backend, gpu_layers, kv_type):
    """Perplexity of MODEL (default: the reference model, Gemma 3 270M Q4_K_M) on the text FILE, by
    llama.cpp's method: chunks of --ctx tokens, the second half of each scored."""
    from edged.loader import load
    from edged.perplexity import perplexity
    from edged.quant import GGUFError

    if len(paths) > 2:
        raise click.UsageError("expected [MODEL] FILE")
    model, file = (None, paths[0]) if len(paths) == 1 else paths
    if model is None:  # fidelity figures are recorded on Gemma, whatever the store holds
        from edged.model_path import resolve_reference_model

        model = str(resolve_reference_model())
    try:
        lm = load(model, backend=backend, gpu_layers=gpu_layers, kv_tokens=ctx, batch_tokens=ctx, kv_type=kv_type)
    except (GGUFError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    try:
        with open(file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise click.ClickException(str(e)) from None
    tokens = lm.tokenizer.encode(text, add_special=True, parse_special=False)
    t0 = time.perf_counter()
    last = None
    try:
        for r in perplexity(lm.model, tokens, lm.tokenizer.bos_id, ctx=ctx):
            last = r
            if not as_json:
                click.echo(f"[{r.chunk + 1}/{r.n_chunks}] {r.ppl:.4f}")
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    elapsed = time.perf_counter() - t0
    if as_json:
        click.echo(json.dumps({"ppl": last.ppl, "chunks": last.n_chunks, "ctx": ctx, "kv_type": kv_type,
                               "tokens": len(tokens), "scored": last.n_scored,
                               "seconds": elapsed}))
    else:
        click.echo(f"Final estimate: PPL = {last.ppl:.4f} ({last.n_chunks} chunks of {ctx}, "
                   f"{kv_type} KV, {elapsed:.1f} s)")
