#!/usr/bin/env python3
"""Fuzz the load path or the request parsers and count the outcomes (docs/FUZZING.md).

    .venv/bin/python bench/fuzz.py load     --seconds 600 [--jobs 1] [--atheris]
    .venv/bin/python bench/fuzz.py requests --seconds 600 [--jobs 1]

load: structure-aware mutants of tiny models of every architecture through tests/fuzz/targets.py
load_path; requests: mutated JSON bodies POSTed to every route of the app in process. Prints inputs
run, inputs/s and the outcomes by class; a bad outcome (untyped error, non-finite logits, 5xx, hang)
saves its input and traceback under --out and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BAD = ("untyped", "nonfinite", "hang", "server_fault")
_WARMUP_S = 600.0  # the seeds' limit: their first forward passes compile (or load) the kernels


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang("input exceeded its time limit")


class Runner:
    """Runs one input at a time under a per-input alarm and a watchdog, counting outcomes."""

    def __init__(self, target: str, out: Path, timeout_s: float):
        from tests.fuzz import targets

        self.t, self.target, self.out, self.timeout_s = targets, target, out, timeout_s
        self.counts: Counter = Counter()
        self.n = 0
        self.current: tuple | None = None  # (started, data, limit) of the input being run
        signal.signal(signal.SIGALRM, _alarm)
        threading.Thread(target=self._watchdog, daemon=True).start()

    def _watchdog(self):
        """An input stuck in compiled code never sees the alarm: save it and end the process."""
        while True:
            time.sleep(1.0)
            cur = self.current
            if cur and time.perf_counter() - cur[0] > 3 * cur[2]:
                self._save("hang", cur[1], "stuck past 3x the per-input limit (no Python frame ran)")
                print(f"fuzz: hang in compiled code after {self.n} inputs; input saved", file=sys.stderr)
                self.report()
                os._exit(3)

    def run_one(self, data: bytes, route: str | None = None, timeout_s: float | None = None) -> str:
        t = self.t
        limit = timeout_s or self.timeout_s
        self.current = (time.perf_counter(), data, limit)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            if route is None:
                t.load_path(data)
                cls = "clean"
            else:
                cls = f"{route} {t.request_body(route, data)}"
        except Hang:
            cls, tb = "hang", traceback.format_exc()
        except t.NonFiniteLoad:
            cls, tb = "nonfinite", traceback.format_exc()
        except t.ServerFault:
            cls, tb = "server_fault", traceback.format_exc()
        except t.LOAD_ERRORS as e:
            cls = f"typed {type(e).__name__}" if route is None else "untyped"
            tb = traceback.format_exc()
        except Exception:
            cls, tb = "untyped", traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.current = None
        self.n += 1
        self.counts[cls] += 1
        if cls in BAD:
            self._save(cls, data, f"route: {route}\n{tb}")
        return cls

    def _save(self, cls: str, data: bytes, text: str):
        self.out.mkdir(parents=True, exist_ok=True)
        k = sum(1 for _ in self.out.glob(f"{cls}-*.bin"))
        if k < 50:  # enough to reproduce; the counts say how many
            (self.out / f"{cls}-{k}.bin").write_bytes(data)
            (self.out / f"{cls}-{k}.txt").write_text(text)

    def summary(self, seconds: float) -> dict:
        return {"target": self.target, "inputs": self.n, "seconds": round(seconds, 1),
                "outcomes": dict(self.counts)}

    def report(self, seconds: float | None = None):
        s = self.summary(seconds or 0.0)
        print(json.dumps(s), flush=True)


def _print_summary(s: dict) -> int:
    rate = s["inputs"] / s["seconds"] if s["seconds"] else 0.0
    print(f"{s['target']}: {s['inputs']} inputs in {s['seconds']:.0f} s ({rate:.1f} inputs/s)")
    for cls, n in sorted(s["outcomes"].items(), key=lambda kv: -kv[1]):
        print(f"  {n:>9}  {cls}")
    bad = sum(n for c, n in s["outcomes"].items() if c in BAD)
    print(f"bad outcomes: {bad}" + (" (inputs and tracebacks saved under --out)" if bad else ""))
    return 1 if bad else 0


def _loop(args) -> dict:
    import numpy as np

    from tests.fuzz import mutators

    runner = Runner(args.target, Path(args.out), args.timeout)
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="edged-fuzz-seeds-") as d:
        if args.target == "load":
            seeds = mutators.write_seeds(d)
            for s in seeds:  # the seeds themselves load cleanly (else the mutants prove nothing)
                assert runner.run_one(s.data, timeout_s=_WARMUP_S) == "clean", s.name
            make = lambda: (mutators.mutate_gguf(rng, seeds[rng.integers(len(seeds))]), None)  # noqa: E731
        else:
            bodies = mutators.request_seeds(runner.t.served_model())
            names = mutators.field_names(bodies)
            routes = sorted(bodies)
            for route in routes:
                for b in bodies[route]:
                    cls = runner.run_one(json.dumps(b).encode(), route, timeout_s=_WARMUP_S)
                    assert cls == f"{route} 200", (route, b, cls)

            def make():
                route = routes[rng.integers(len(routes))]
                seed = bodies[route][rng.integers(len(bodies[route]))]
                return mutators.mutate_json(rng, seed, names), route
        t0 = time.perf_counter()
        last = t0
        while time.perf_counter() - t0 < args.seconds and runner.n < args.max_inputs:
            data, route = make()
            runner.run_one(data, route)
            if time.perf_counter() - last > args.progress:
                last = time.perf_counter()
                print(f"fuzz: {runner.n} inputs, {runner.n / (last - t0):.1f}/s, "
                      f"bad {sum(runner.counts[c] for c in BAD)}", file=sys.stderr, flush=True)
        return runner.summary(time.perf_counter() - t0)


_ATHERIS_MODULES = ["edged.quant.gguf", "edged.quant.gguf_parse", "edged.models", "edged.tokenizer.vocab",
                    "edged.tokenizer.tokenizer", "edged.tokenizer.bpe", "edged.chat", "edged.chat_sandbox",
                    "edged.chat_limits", "edged.loader", "edged.offload"]


def _atheris(args) -> None:
    """Coverage-guided: atheris mutates (half of the time from our structure-aware mutants)."""
    import atheris
    import numpy as np

    # coverage of the validating Python only: instrumented bytecode breaks Numba's compile of kernels,
    # so the modules holding kernels are imported first, as they are
    import edged.backends.cpu  # noqa: F401
    import edged.tokenizer.spm  # noqa: F401

    with atheris.instrument_imports(include=_ATHERIS_MODULES):
        from tests.fuzz import mutators, targets  # noqa: F401
    runner = Runner(args.target, Path(args.out), args.timeout)
    rng = np.random.default_rng(args.seed)
    seeds = mutators.write_seeds(tempfile.mkdtemp(prefix="edged-fuzz-seeds-"))
    t0 = time.perf_counter()

    def mutator(data, max_size, seed):
        if rng.random() < 0.5 or len(data) < 64:
            return mutators.mutate_gguf(rng, seeds[rng.integers(len(seeds))])[:max_size]
        return atheris.Mutate(data, max_size)

    last = [t0]

    def one(data):
        runner.run_one(bytes(data))
        now = time.perf_counter()
        if now - t0 >= args.seconds or runner.n >= args.max_inputs:  # libFuzzer's own exit skips atexit
            rc = _print_summary(runner.summary(now - t0))
            sys.stdout.flush()
            os._exit(rc)
        if now - last[0] > args.progress:
            last[0] = now
            print(f"fuzz: {runner.n} inputs, {runner.n / (now - t0):.1f}/s, "
                  f"bad {sum(runner.counts[c] for c in BAD)}", file=sys.stderr, flush=True)

    atheris.Setup([sys.argv[0], "-max_len=200000", "-print_final_stats=1"], one, custom_mutator=mutator)
    atheris.Fuzz()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", choices=("load", "requests"))
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--max-inputs", type=int, default=10**9)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes, each with its own seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0, help="per-input limit (a hang), seconds")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "edged-fuzz-findings"),
                    help="where bad inputs and tracebacks go")
    ap.add_argument("--progress", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--atheris", action="store_true", help="coverage-guided (load only; pip install atheris)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.atheris and args.target != "load":
        ap.error("--atheris drives the load target only")
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # one core per job
    sys.path.insert(0, str(ROOT))
    if args.atheris:
        try:
            import atheris  # noqa: F401
        except ImportError:
            ap.error("--atheris needs atheris: .venv/bin/python -m pip install atheris")
        _atheris(args)
        return 0
    if args.worker or args.jobs == 1:
        s = _loop(args)
        if args.worker:
            print(json.dumps(s), flush=True)
            return 0
        return _print_summary(s)
    procs = [subprocess.Popen([sys.executable, __file__, args.target, "--worker", "--seconds", str(args.seconds),
                               "--max-inputs", str(args.max_inputs // args.jobs), "--seed", str(args.seed + i),
                               "--timeout", str(args.timeout), "--out", f"{args.out}/job{i}",
                               "--progress", str(args.progress)], stdout=subprocess.PIPE, text=True)
             for i in range(args.jobs)]
    total = {"target": args.target, "inputs": 0, "seconds": 0.0, "outcomes": Counter()}
    for p in procs:
        out, _ = p.communicate()
        s = json.loads(out.strip().splitlines()[-1])
        total["inputs"] += s["inputs"]
        total["seconds"] = max(total["seconds"], s["seconds"])
        total["outcomes"].update(s["outcomes"])
    return _print_summary(total)


if __name__ == "__main__":
    sys.exit(main())
