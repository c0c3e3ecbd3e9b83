#!/usr/bin/env python3
"""Speculation with a draft model (`--draft`): decode tokens/s of a target model with and without a
draft model of the same vocabulary proposing its tokens, over a few chat questions, alternating
runs, medians; the replies must be token for token identical (exit 1 otherwise).

    .venv/bin/python bench/spec_draft.py TARGET DRAFT [--repeat 5] [--gen-tokens 256]
                                         [--spec-max 8] [--p-min 0] [--concurrency 1]
                                         [--always] [--json]

--concurrency N runs max(N, 4) questions (the four cycled), N at a time, and reports their
aggregate tokens/s, prefill included. --always adds a third engine that drafts at every step
(--spec-always), beside the default one that drafts only where drafting measured faster
(--spec-adaptive).

On a machine without a larger model of the draft's family, bench/f16_copy.py makes one: the F16
copy of a quantized model as the target, the quantized file as its draft (docs/SERVER.md).
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
    ap.add_argument("--concurrency", type=int, default=1, help="questions asked at once")
    ap.add_argument("--always", action="store_true", help="also time drafting at every step")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from edged.loader import load

    lm = load(a.target, quiet=a.json)
    tok = lm.tokenizer
    draft = load_draft(a.draft, tok, quiet=a.json).model
    asked = [tok.encode(lm.chat.render([{"role": "user", "content": q}]), add_special=True, parse_special=True)
             for q in QUESTIONS]
    c = max(1, a.concurrency)
    prompts = [asked[i % len(asked)] for i in range(max(c, len(asked)))]
    ctx = max(map(len, prompts)) + a.gen_tokens + 16
    kv = plan_kv(lm.model, 16, ctx=ctx, max_seqs=c, max_batch_tokens=512)
    arms = [("plain", None, True), ("draft", "draft", True)] + ([("always", "draft", False)] if a.always else [])
    engines = {name: Engine(lm.model, tok, EngineConfig.from_plan(
        kv, max_batch_tokens=512, max_seqs=c, enable_prefix_cache=False, spec=spec, spec_max=a.spec_max,
        spec_p_min=a.p_min, spec_adaptive=adaptive), draft=draft if spec else None).start()
        for name, spec, adaptive in arms}
    params = SamplingParams(temperature=0.0, max_tokens=a.gen_tokens)
    runs: dict[str, list[list[dict]]] = {name: [] for name, _, _ in arms}  # [run][question]
    try:
        for e in engines.values():  # compiles what the first timed runs would
            one_run(e, prompts[0], SamplingParams(temperature=0.0, max_tokens=24))
        for r in range(a.repeat):
            for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                runs[name].append([one_run(engines[name], p, params) for p in prompts] if c == 1
                                  else _together(engines[name], prompts, params))
    finally:
        for e in engines.values():
            e.stop()
    ids = [q["ids"] for q in runs["plain"][0]]
    same = all([q["ids"] for q in run] == ids for rs in runs.values() for run in rs)

    def tok_s(run):  # c = 1: a run's decode tokens/s over all questions; else the aggregate
        if c > 1:
            return run[0]["aggregate_tok_s"]
        return sum(len(q["ids"]) - 1 for q in run) / sum((len(q["ids"]) - 1) / q["decode_tok_s"] for q in run)

    med = {k: statistics.median(tok_s(run) for run in rs) for k, rs in runs.items()}
    drafted = sum(q["drafted"] for run in runs["draft"] for q in run)
    accepted = sum(q["accepted"] for run in runs["draft"] for q in run)
    report = {
        "cpu": cpu_model(), "target": str(lm.path), "draft": a.draft, "questions": len(QUESTIONS),
        "concurrency": c, "reply_tokens": [len(x) for x in ids], "spec_max": a.spec_max, "p_min": a.p_min,
        "repeat": a.repeat, "tokens_identical": same,
        "plain_decode_tok_s": med["plain"], "draft_decode_tok_s": med["draft"],
        "speedup": med["draft"] / med["plain"],
        "plain_runs": [tok_s(run) for run in runs["plain"]], "draft_runs": [tok_s(run) for run in runs["draft"]],
        "acceptance": accepted / drafted if drafted else 0.0,
    }
    if a.always:
        report.update(always_decode_tok_s=med["always"], always_speedup=med["always"] / med["plain"],
                      always_runs=[tok_s(run) for run in runs["always"]])
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['cpu']}; {len(prompts)} questions, {c} at once, replies of {report['reply_tokens']} "
              f"tokens, medians of {a.repeat}")
        kind = "decode tok/s" if c == 1 else "aggregate tok/s"
        always = f"; --spec-always {med['always']:.1f}: {report['always_speedup']:.2f}x" if a.always else ""
        print(f"{kind}: plain {med['plain']:.1f}, --draft --spec-max {a.spec_max} --draft-p-min "
              f"{a.p_min} {med['draft']:.1f}: {report['speedup']:.2f}x{always}; drafts accepted "
              f"{report['acceptance']:.1%}; reply tokens identical: {same}")
    return 0 if same else 1


def _together(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[dict]:
    """All the prompts at once (the engine runs its max_seqs of them, the rest wait), with the
    aggregate tokens/s of the whole (prefill included) in each entry's "aggregate_tok_s"."""
    s0 = engine.stats()
    t0 = time.perf_counter()
    streams = [engine.add_request(p, params) for p in prompts]
    out = [[d.token_id for d in stream if d.token_id is not None] for stream in streams]
    wall = time.perf_counter() - t0
    s1 = engine.stats()
    total = sum(map(len, out))
    drafted = s1.spec_draft_tokens - s0.spec_draft_tokens
    accepted = s1.spec_accepted_tokens - s0.spec_accepted_tokens
    return [{"ids": ids, "aggregate_tok_s": total / wall, "drafted": drafted if i == 0 else 0,
             "accepted": accepted if i == 0 else 0} for i, ids in enumerate(out)]


if __name__ == "__main__":
    sys.exit(main())
