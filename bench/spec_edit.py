#!/usr/bin/env python3
"""N-gram speculation on an edit workload (issue 17's acceptance line): the prompt holds a ~1,500-
token document (the GPL-3 text of tests/fixtures from its preamble, one line per paragraph) and asks
the model to repeat it exactly; the greedy reply copies most of it, with whatever small changes the
model makes (`reply_copied` in the report: the share of reply tokens that continue a 4-gram of the
prompt). Decode tokens/s with and without `--spec ngram`, alternating runs, medians; the replies
must be token for token identical (exit 1 otherwise).

    .venv/bin/python bench/spec_edit.py [--model PATH_OR_NAME] [--repeat 5] [--gen-tokens 512]
                                        [--spec-max 8] [--doc-tokens 1500] [--hard-wrapped] [--json]

--hard-wrapped keeps the text's 72-column line breaks, which the model re-wraps as it copies: more
changes, shorter accepted drafts.
MODEL left out is the default Gemma 3 270M (docs/BENCHMARKS.md's reference model), with the
built-in gemma chat template.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edged.bench.structured import cpu_model  # noqa: E402
from edged.engine.engine import Engine, EngineConfig  # noqa: E402
from edged.engine.sizing import plan_kv  # noqa: E402
from edged.sampling import SamplingParams  # noqa: E402

DOCUMENT = ROOT / "tests" / "fixtures" / "ppl_text_gpl3.txt"
ASK = "Repeat the following text exactly, word for word, with no comment before or after it.\n\n"


def document(tokenizer, n_tokens: int, hard_wrapped: bool = False) -> str:
    """The text's paragraphs from the preamble on (the centred title makes a small model loop), as
    many as fit in n_tokens tokens (at least one); each on one line unless hard_wrapped."""
    paragraphs = DOCUMENT.read_text().split("\n\n")[3:]
    if not hard_wrapped:
        paragraphs = [" ".join(p.split()) for p in paragraphs]
    text = paragraphs[0]
    for p in paragraphs[1:]:
        longer = text + "\n\n" + p
        if len(tokenizer.encode(longer)) > n_tokens:
            break
        text = longer
    return text


def one_run(engine: Engine, prompt: list[int], params: SamplingParams) -> dict:
    """Decode tok/s of one reply (after its first token: the prefill is not counted)."""
    s0 = engine.stats()
    ids, t_first = [], None
    for d in engine.add_request(prompt, params):
        if d.finish_reason == "error":
            raise RuntimeError(d.error)
        if d.token_id is not None:
            ids.append(d.token_id)
            t_first = t_first or time.perf_counter()
    t_end = time.perf_counter()
    s1 = engine.stats()
    drafted = s1.spec_draft_tokens - s0.spec_draft_tokens
    return {"ids": ids, "decode_tok_s": (len(ids) - 1) / (t_end - t_first),
            "drafted": drafted, "accepted": s1.spec_accepted_tokens - s0.spec_accepted_tokens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each kind (alternating)")
    ap.add_argument("--gen-tokens", type=int, default=512, help="most reply tokens per run")
    ap.add_argument("--spec-max", type=int, default=8)
    ap.add_argument("--doc-tokens", type=int, default=1500)
    ap.add_argument("--hard-wrapped", action="store_true", help="keep the text's line breaks")
    ap.add_argument("--chat-template", default=None,
                    help="built-in name or Jinja source; default: the file's, or gemma for the default "
                         "model (its file has none: ChatML would make it loop on the markers)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from edged.loader import load
    from edged.model_path import resolve_reference_model

    template = a.chat_template or (None if a.model else "gemma")
    lm = load(a.model or str(resolve_reference_model()), chat_template=template, quiet=a.json)
    tok = lm.tokenizer
    doc = document(tok, a.doc_tokens, a.hard_wrapped)
    text = lm.chat.render([{"role": "user", "content": ASK + doc}])
    prompt = tok.encode(text, add_special=True, parse_special=True)
    ctx = len(prompt) + a.gen_tokens + 16
    kv = plan_kv(lm.model, 16, ctx=ctx, max_seqs=1, max_batch_tokens=512)
    engines = {name: Engine(lm.model, tok, EngineConfig.from_plan(
        kv, max_batch_tokens=512, max_seqs=1, enable_prefix_cache=False, spec=spec,
        spec_max=a.spec_max)).start() for name, spec in (("plain", None), ("spec", "ngram"))}
    params = SamplingParams(temperature=0.0, max_tokens=a.gen_tokens)
    runs: dict[str, list[dict]] = {"plain": [], "spec": []}
    try:
        for e in engines.values():  # compiles what the first timed runs would (prefill, verify shapes)
            one_run(e, prompt, SamplingParams(temperature=0.0, max_tokens=24))
        for _ in range(a.repeat):
            for name in ("plain", "spec"):
                runs[name].append(one_run(engines[name], prompt, params))
    finally:
        for e in engines.values():
            e.stop()
    ids = runs["plain"][0]["ids"]
    same = all(r["ids"] == ids for rs in runs.values() for r in rs)
    med = {k: statistics.median(r["decode_tok_s"] for r in rs) for k, rs in runs.items()}
    drafted = sum(r["drafted"] for r in runs["spec"])
    accepted = sum(r["accepted"] for r in runs["spec"])
    report = {
        "cpu": cpu_model(), "model": str(lm.path), "document_tokens": len(tok.encode(doc)),
        "prompt_tokens": len(prompt), "reply_tokens": len(ids), "spec_max": a.spec_max,
        "repeat": a.repeat, "tokens_identical": same,
        "plain_decode_tok_s": med["plain"], "spec_decode_tok_s": med["spec"],
        "speedup": med["spec"] / med["plain"],
        "plain_runs": [r["decode_tok_s"] for r in runs["plain"]],
        "spec_runs": [r["decode_tok_s"] for r in runs["spec"]],
        "acceptance": accepted / drafted if drafted else 0.0,
        "accepted_per_step": accepted / max(1, (len(ids) - 1) * a.repeat - accepted),
        "reply_copied": _copied_share(ids, prompt), "hard_wrapped": a.hard_wrapped,
        "reply_start": tok.decode(ids[:40]),
    }
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['cpu']}; {report['prompt_tokens']}-token prompt ({report['document_tokens']}-token "
              f"document), {report['reply_tokens']}-token reply ({report['reply_copied']:.0%} copied), "
              f"medians of {a.repeat}")
        print(f"decode tok/s: plain {med['plain']:.1f}, --spec ngram --spec-max {a.spec_max} "
              f"{med['spec']:.1f}: {report['speedup']:.2f}x; drafts accepted {report['acceptance']:.1%}, "
              f"{report['accepted_per_step']:.2f} a step; reply tokens identical: {same}")
    return 0 if same else 1


def _copied_share(reply: list[int], prompt: list[int]) -> float:
    """Share of the reply's tokens whose 4-gram ending there occurs in the prompt."""
    grams = {tuple(prompt[i - 4 : i]) for i in range(4, len(prompt) + 1)}
    hits = sum(tuple(reply[i - 4 : i]) in grams for i in range(4, len(reply) + 1))
    return hits / max(1, len(reply) - 3)


if __name__ == "__main__":
    sys.exit(main())
