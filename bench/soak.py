#!/usr/bin/env python3
"""Soak test of a running (or self-started) `edged serve`: N clients for T minutes, streamed and
whole requests, a share of the streams cancelled mid-way, greedy probes whose text must never change.

    .venv/bin/python bench/soak.py --model PATH_OR_NAME [--clients 64] [--minutes 30] [--cancel 0.3]
    .venv/bin/python bench/soak.py --url http://127.0.0.1:8080 [--pid PID] ...

At the end it checks (exit 1 when one fails): no 5xx, no transport error, no stream ending in an
error, every probe answer equal to its first one, no KV block in use once the load stops, and,
when it knows the server's process (it started it, or --pid), RSS growth after the warm-up within
--max-rss-growth percent. docs/SOAK.md has the figures of past runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edged.bench.serve import make_prompts, percentiles  # noqa: E402

PROBES = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")
# the KV series that must read 0 after the load (summed over the loaded models)
KV_SERIES = ("edged_kv_blocks_used", "edged_kv_window_blocks_used", "edged_requests_running",
             "edged_requests_waiting")


@dataclass
class Tally:
    """What the clients saw."""

    requests: int = 0
    streamed: int = 0
    cancelled: int = 0
    status: dict = field(default_factory=dict)  # "2xx" / "4xx" / "5xx" -> count
    transport_errors: int = 0
    stream_errors: int = 0
    first_errors: list = field(default_factory=list)
    output_tokens: int = 0
    e2e_s: list = field(default_factory=list)
    probes: int = 0
    probe_mismatches: int = 0

    def error(self, what: str) -> None:
        if len(self.first_errors) < 5:
            self.first_errors.append(what[:300])

    def count_status(self, code: int) -> None:
        k = f"{code // 100}xx"
        self.status[k] = self.status.get(k, 0) + 1


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_figures(samples: list[tuple[float, int]], warmup_s: float) -> dict:
    """Slope (MiB/min, least squares) and growth (%: last samples' mean vs the first after the
    warm-up) of the RSS samples taken after `warmup_s`."""
    after = [(t, kib) for t, kib in samples if t >= warmup_s]
    if len(after) < 3:
        return {"samples": len(after), "slope_mib_per_min": None, "growth_pct": None}
    ts = [t for t, _ in after]
    ys = [kib / 1024 for _, kib in after]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else 0.0
    tail = ys[-3:]
    growth = (sum(tail) / len(tail) - ys[0]) / ys[0] * 100
    return {"samples": len(after), "first_mib": round(ys[0], 1), "last_mib": round(ys[-1], 1),
            "max_mib": round(max(ys), 1), "slope_mib_per_min": round(slope * 60, 3),
            "growth_pct": round(growth, 2)}


class Soak:
    def __init__(self, args, url: str, headers: dict):
        self.a = args
        self.url = url.rstrip("/")
        self.headers = headers
        self.t = Tally()
        self.rng = random.Random(args.seed)
        self.prompts = make_prompts(256, args.prompt_tokens, seed=args.seed)
        self.probe_answers: dict[str, str] = {}

    def _body(self, prompt: str, stream: bool) -> dict:
        body = {"prompt": prompt, "max_tokens": self.rng.randint(8, self.a.max_tokens),
                "temperature": 0.8, "seed": self.rng.randrange(2**31), "stream": stream}
        if self.a.served_model:
            body["model"] = self.a.served_model
        return body

    async def _streamed(self, client, body: dict, cancel_after: int | None) -> None:
        t = self.t
        async with client.stream("POST", f"{self.url}/v1/completions", json=body,
                                 headers=self.headers) as r:
            t.count_status(r.status_code)
            if r.status_code != 200:
                t.error(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                return
            chunks = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return
                obj = json.loads(line[6:])
                ch = (obj.get("choices") or [{}])[0]
                if "error" in obj or ch.get("finish_reason") == "error":
                    t.stream_errors += 1
                    t.error(f"stream error: {line[:200]}")
                    return
                chunks += 1
                t.output_tokens += 1
                if cancel_after is not None and chunks >= cancel_after:
                    t.cancelled += 1  # leaving the block closes the connection mid-stream
                    return
            t.stream_errors += 1
            t.error("stream ended without [DONE]")

    async def _whole(self, client, body: dict) -> dict | None:
        r = await client.post(f"{self.url}/v1/completions", json=body, headers=self.headers)
        self.t.count_status(r.status_code)
        if r.status_code != 200:
            self.t.error(f"HTTP {r.status_code}: {r.text[:200]}")
            return None
        obj = r.json()
        self.t.output_tokens += obj["usage"]["completion_tokens"]
        return obj

    async def client_loop(self, client, deadline: float) -> None:
        a, t = self.a, self.t
        while time.monotonic() < deadline:
            stream = self.rng.random() < a.stream_share
            body = self._body(self.rng.choice(self.prompts), stream)
            cancel_after = (self.rng.randint(1, max(1, body["max_tokens"] // 2))
                            if stream and self.rng.random() < a.cancel else None)
            t.requests += 1
            t.streamed += stream
            t0 = time.monotonic()
            try:
                if stream:
                    await self._streamed(client, body, cancel_after)
                else:
                    await self._whole(client, body)
                t.e2e_s.append(time.monotonic() - t0)
            except Exception as e:  # refused, reset, timed out: the acceptance counts each one
                t.transport_errors += 1
                t.error(f"{type(e).__name__}: {e}")

    async def probe_loop(self, client, deadline: float) -> None:
        """The greedy probes, every --probe-every seconds while the load runs (and once first)."""
        while True:
            for p in PROBES:
                body = {"prompt": p, "max_tokens": 24, "temperature": 0.0}
                if self.a.served_model:
                    body["model"] = self.a.served_model
                try:
                    obj = await self._whole(client, body)
                except Exception as e:
                    self.t.transport_errors += 1
                    self.t.error(f"probe {type(e).__name__}: {e}")
                    continue
                if obj is None:
                    continue
                text = obj["choices"][0]["text"]
                self.t.probes += 1
                first = self.probe_answers.setdefault(p, text)
                if text != first:
                    self.t.probe_mismatches += 1
                    self.t.error(f"probe {p!r} changed: {first!r} -> {text!r}")
            if time.monotonic() + self.a.probe_every >= deadline:
                return
            await asyncio.sleep(self.a.probe_every)

    async def rss_loop(self, pid: int, start: float, deadline: float, out: list) -> None:
        while time.monotonic() < deadline:
            kib = rss_kib(pid)
            if kib is not None:
                out.append((time.monotonic() - start, kib))
            await asyncio.sleep(self.a.rss_every)

    async def run(self, pid: int | None) -> dict:
        import httpx

        a = self.a
        limits = httpx.Limits(max_connections=a.clients + 4, max_keepalive_connections=a.clients + 4)
        async with httpx.AsyncClient(timeout=a.request_timeout, limits=limits) as client:
            await self.probe_loop(client, 0)  # the reference answers, before any load
            start = time.monotonic()
            deadline = start + a.minutes * 60
            rss: list = []
            tasks = [self.client_loop(client, deadline) for _ in range(a.clients)]
            tasks.append(self.probe_loop(client, deadline))
            if pid is not None:
                tasks.append(self.rss_loop(pid, start, deadline, rss))
            await asyncio.gather(*tasks)
            await self.probe_loop(client, 0)  # and once more with the server idle
            wall = time.monotonic() - start
        kv = await asyncio.to_thread(settled_kv, self.url, self.headers)
        t = self.t
        return {"clients": a.clients, "minutes": a.minutes, "wall_s": round(wall, 1),
                "requests": t.requests, "streamed": t.streamed, "cancelled": t.cancelled,
                "status": t.status, "transport_errors": t.transport_errors,
                "stream_errors": t.stream_errors, "probes": t.probes,
                "probe_mismatches": t.probe_mismatches, "output_tokens": t.output_tokens,
                "tok_s": round(t.output_tokens / wall, 1), "e2e_s": percentiles(t.e2e_s),
                "kv_after": kv, "rss": rss_figures(rss, a.minutes * 60 * a.warmup_share) if pid else None,
                "first_errors": t.first_errors}


def settled_kv(url: str, headers: dict, timeout: float = 30.0) -> dict:
    """The KV series of /metrics once they read 0 (or as they are when `timeout` runs out)."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
        vals = {k: 0.0 for k in KV_SERIES}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in vals:
                vals[name] += float(line.rsplit(" ", 1)[1])
        if not any(vals.values()) or time.monotonic() > deadline:
            return vals
        time.sleep(0.5)


def verdict(r: dict, max_rss_growth: float) -> list[str]:
    """The acceptance lines that failed (empty: pass)."""
    bad = []
    if not r["requests"]:
        bad.append("no request was sent")
    if r["status"].get("5xx"):
        bad.append(f"{r['status']['5xx']} responses were 5xx")
    if r["transport_errors"]:
        bad.append(f"{r['transport_errors']} transport errors")
    if r["stream_errors"]:
        bad.append(f"{r['stream_errors']} streams ended in an error")
    if r["probe_mismatches"] or not r["probes"]:
        bad.append(f"greedy probes changed {r['probe_mismatches']} times ({r['probes']} sent)")
    if any(r["kv_after"].values()):
        bad.append(f"KV still in use after the load: {r['kv_after']}")
    g = (r["rss"] or {}).get("growth_pct")
    if g is not None and g > max_rss_growth:
        bad.append(f"RSS grew {g}% after the warm-up (limit {max_rss_growth}%)")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="a running server")
    src.add_argument("--model", help="start `edged serve MODEL` (a path or a store name) for the run")
    ap.add_argument("--pid", type=int, help="the --url server's process id (for its RSS)")
    ap.add_argument("--api-key")
    ap.add_argument("--served-model", help="the `model` field to send (default: the server's default)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--cancel", type=float, default=0.3, help="share of streams cancelled mid-way")
    ap.add_argument("--stream-share", type=float, default=0.5, help="share of requests streamed")
    ap.add_argument("--probe-every", type=float, default=30.0, help="seconds between greedy probes")
    ap.add_argument("--max-tokens", type=int, default=64, help="most tokens one request asks for")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--warmup-share", type=float, default=0.2,
                    help="share of the run before RSS growth is measured")
    ap.add_argument("--max-rss-growth", type=float, default=5.0, help="percent allowed after warm-up")
    ap.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more `edged serve` argument (repeatable) with --model")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for name in ("cancel", "stream_share", "warmup_share"):
        if not 0 <= getattr(a, name) <= 1:
            ap.error(f"--{name.replace('_', '-')} must be in 0..1")
    if a.clients < 1 or a.minutes <= 0:
        ap.error("--clients must be >= 1 and --minutes > 0")

    server = None
    headers = {"authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    pid = a.pid
    if a.model:
        from tests.server.server_proc import ServerProcess

        log = Path(tempfile.mkdtemp(prefix="edged-soak-")) / "serve.log"
        server = ServerProcess([a.model, "--max-seqs", str(min(a.clients, 64)), "--ctx", "1024",
                                "--log-level", "warning", *a.serve_arg], log, api_key=a.api_key)
        print(f"soak: starting edged serve {a.model} (log {log})", file=sys.stderr)
        server.wait_ready(1800)
        url, pid = server.url, server.proc.pid
    else:
        url = a.url
    try:
        result = asyncio.run(Soak(a, url, headers).run(pid))
    finally:
        if server is not None:
            result_rc = server.stop()
            print(f"soak: edged serve exited {result_rc}", file=sys.stderr)
    failed = verdict(result, a.max_rss_growth)
    result["failed"] = failed
    print(json.dumps(result, indent=2))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    for line in failed:
        print(f"FAIL: {line}", file=sys.stderr)
    print("soak: " + ("FAIL" if failed else "PASS"), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
