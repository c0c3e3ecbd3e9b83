#!/usr/bin/env python3
"""Speculation with a draft model (`--draft`): decode tokens/s of a target model with and without a
draft model of the same vocabulary proposing its tokens, over a few chat questions, alternating
runs, medians; the replies must be token for token identical (exit 1 otherwise).

    .venv/bin/python bench/spec_draft.py TARGET DRAFT [--repeat 5] [--gen-tokens 256]
                                         [--spec-max 8] [--p-min 0] [--json]

On a machine without a larger model of the draft's family, bench/f16_copy.py makes one: the F16
copy of a quantized model as the target, the quantized file as its draft (docs/SERVER.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edged.bench.structured import cpu_model  # noqa: E402
from edged.engine.engine import Engine, EngineConfig  # noqa: E402
from edged.engine.sizing import plan_kv  # noqa: E402
from edged.engine.spec_draft import load_draft  # noqa: E402
from edged.sampling import SamplingParams  # noqa: E402
from spec_edit import one_run  # noqa: E402

QUESTIONS = (
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main differences between a list and a tuple in Python?",
    "Give me five tips for learning a new language.",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each kind (alternating)")
    ap.add_argument("--gen-tokens", type=int, default=256, help="most reply tokens per question")
    ap.add_argument("--spec-max", type=int, default=8)
    ap.add_argument("--p-min", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from edged.loader import load

    lm = load(a.target, quiet=a.json)
    tok = lm.tokenizer
    draft = load_draft(a.draft, tok, quiet=a.json)
    prompts = [tok.encode(lm.chat.render([{"role": "user", "content": q}]), add_special=True, parse_special=True)
               for q in QUESTIONS]
    ctx = max(map(len, prompts)) + a.gen_tokens + 16
    kv = plan_kv(lm.model, 16, ctx=ctx, max_seqs=1, max_batch_tokens=512)
    engines = {name: Engine(lm.model, tok, EngineConfig.from_plan(
        kv, max_batch_tokens=512, max_seqs=1, enable_prefix_cache=False, spec=spec, spec_max=a.spec_max,
        spec_p_min=a.p_min), draft=draft if spec else None).start() for name, spec in (("plain", None),
                                                                                      ("draft", "draft"))}
    params = SamplingParams(temperature=0.0, max_tokens=a.gen_tokens)
    runs: dict[str, list[list[dict]]] = {"plain": [], "draft": []}  # [run][question]
    try:
        for e in engines.values():  # compiles what the first timed runs would
            one_run(e, prompts[0], SamplingParams(temperature=0.0, max_tokens=24))
        for r in range(a.repeat):
            for name in ("plain", "draft") if r % 2 == 0 else ("draft", "plain"):
                runs[name].append([one_run(engines[name], p, params) for p in prompts])
    finally:
        for e in engines.values():
            e.stop()
    ids = [q["ids"] for q in runs["plain"][0]]
    same = all([q["ids"] for q in run] == ids for rs in runs.values() for run in rs)

    def tok_s(run):  # a run's decode tokens/s over all questions
        return sum(len(q["ids"]) - 1 for q in run) / sum((len(q["ids"]) - 1) / q["decode_tok_s"] for q in run)

    med = {k: statistics.median(tok_s(run) for run in rs) for k, rs in runs.items()}
    drafted = sum(q["drafted"] for run in runs["draft"] for q in run)
    accepted = sum(q["accepted"] for run in runs["draft"] for q in run)
    report = {
        "cpu": cpu_model(), "target": str(lm.path), "draft": a.draft, "questions": len(QUESTIONS),
        "reply_tokens": [len(x) for x in ids], "spec_max": a.spec_max, "p_min": a.p_min,
        "repeat": a.repeat, "tokens_identical": same,
        "plain_decode_tok_s": med["plain"], "draft_decode_tok_s": med["draft"],
        "speedup": med["draft"] / med["plain"],
        "plain_runs": [tok_s(run) for run in runs["plain"]], "draft_runs": [tok_s(run) for run in runs["draft"]],
        "acceptance": accepted / drafted if drafted else 0.0,
    }
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['cpu']}; {len(QUESTIONS)} questions, replies of {report['reply_tokens']} tokens, "
              f"medians of {a.repeat}")
        print(f"decode tok/s: plain {med['plain']:.1f}, --draft --spec-max {a.spec_max} --draft-p-min "
              f"{a.p_min} {med['draft']:.1f}: {report['speedup']:.2f}x; drafts accepted "
              f"{report['acceptance']:.1%}; reply tokens identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
