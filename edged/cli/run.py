"""`edged run`: generate from a prompt, streaming text to the terminal (or one JSON object)."""

from __future__ import annotations

import json
import time

import click

from edged.cli.options import kv_type_option
from edged.cli.options import backend_options, model_argument, sampling_options, spec_options, spec_setting


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise click.BadParameter("expected comma-separated integers, e.g. 2,651,9259") from None


@click.command("run")
@model_argument
@click.option("--prompt", "-p", help="Prompt text.")
@click.option("--prompt-ids", help="Prompt as comma-separated token ids (used as given, no BOS added).")
@sampling_options
@click.option("--logprobs", type=click.IntRange(0, 20), default=None,
              help="Report the top-K logprobs of each generated token.")
@click.option("--chat", is_flag=True, help="Apply the model's chat template (prompt as a user message).")
@click.option("--chat-template", default=None, help="Built-in template name or Jinja source.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming.")
@click.option("--ctx", type=int, default=4096, show_default=True, help="Context length (tokens).")
@kv_type_option
@backend_options
@spec_options
def command(model, prompt, prompt_ids, max_tokens, temperature, top_k, top_p, min_p, seed,
            logprobs, chat, chat_template, as_json, ctx, kv_type, backend, gpu_layers, spec, spec_max, draft,
            draft_p_min, spec_adaptive):
    """Generate a continuation of a prompt."""
    from edged.engine.engine import Engine, EngineConfig
    from edged.engine.sizing import plan_kv
    from edged.engine.spec_draft import load_draft
    from edged.loader import load
    from edged.sampling import SamplingParams

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt and --prompt-ids")
    try:
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                seed=seed, logprobs=logprobs, max_tokens=max_tokens)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    lm = _load(load, model, chat_template=chat_template, backend=backend, gpu_layers=gpu_layers, kv_tokens=ctx,
               kv_type=kv_type)
    tok = lm.tokenizer
    if prompt_ids is not None:
        ids = _parse_ids(prompt_ids)
    else:
        text = lm.chat.render([{"role": "user", "content": prompt}]) if chat else prompt
        ids = tok.encode(text, add_special=True, parse_special=True)
    kv = plan_kv(lm.model, 16, ctx=ctx, max_seqs=1, max_batch_tokens=512)
    spec = spec_setting(spec, draft)
    draft_model = _load(load_draft, draft, tok, backend=backend, kv_type=kv_type).model if draft else None
    engine = Engine(lm.model, tok, EngineConfig.from_plan(kv, max_batch_tokens=512, max_seqs=1, spec=spec,
                                                          spec_max=spec_max, spec_p_min=draft_p_min,
                                                          spec_adaptive=spec_adaptive),
                    draft=draft_model).start()
    try:
        t0 = time.perf_counter()
        stream = engine.add_request(ids, params)
        out_ids, pieces, lps, t_first = [], [], [], None
        final = None
        for d in stream:
            if d.token_id is not None and d.finish_reason != "abort":
                t_first = t_first or time.perf_counter()
                if not (d.finish_reason == "stop" and d.token_id in tok.eos_ids):
                    out_ids.append(d.token_id)
                if d.top_logprobs is not None:
                    lps.append([[i, lp] for i, lp in d.top_logprobs])
            pieces.append(d.text)
            if not as_json and d.text:
                click.echo(d.text, nl=False)
            final = d
        t_end = time.perf_counter()
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    finally:
        engine.stop()
    if final is not None and final.finish_reason == "error":
        raise click.ClickException(f"generation failed: {final.error}")
    t_first = t_first or t_end
    n_gen = final.num_output_tokens if final else 0
    timings = {
        "prompt_tokens": len(ids),
        "prompt_tokens_per_s": len(ids) / max(t_first - t0, 1e-9),
        "generated_tokens": n_gen,
        "generated_tokens_per_s": (n_gen - 1) / (t_end - t_first) if n_gen > 1 else 0.0,
        "load_s": lm.load_s,
        "compile_s": lm.compile_s,
    }
    if as_json:
        click.echo(json.dumps({"prompt_ids": ids, "ids": out_ids, "text": "".join(pieces),
                               "logprobs": lps if logprobs is not None else None,
                               "finish_reason": final.finish_reason if final else None,
                               "timings": timings}, ensure_ascii=False))
    else:
        click.echo()
        click.echo(f"[{len(ids)} prompt tokens at {timings['prompt_tokens_per_s']:.1f} tok/s, "
                   f"{n_gen} generated at {timings['generated_tokens_per_s']:.1f} tok/s]", err=True)


def _load(load, *args, **options):
    """load(*args, **options) (a model), its errors as a clean command-line error."""
    from edged.quant import GGUFError

    try:
        return load(*args, **options)
    except (GGUFError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
