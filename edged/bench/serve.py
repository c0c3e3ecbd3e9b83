"""Load generator for any OpenAI-compatible server (edged, llama-server, vLLM): streaming
/v1/completions requests at several concurrency levels; throughput, TTFT, inter-token latency
and errors per level.

Prompts are random common English words (about one token each in the usual tokenizers); the
token counts reported come from the server's own `usage` when it sends one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np

_WORDS = ("time year people way day man thing woman life child world school state family "
          "student group country problem hand part place case week company system program "
          "question work government number night point home water room mother area money story "
          "fact month lot right study book eye job word business issue side kind head house "
          "service friend father power hour game line end member law car city community name "
          "president team minute idea kid body information back parent face others level office "
          "door health person art war history party result change morning reason research girl "
          "guy moment air teacher force education foot boy age policy music market sense nation "
          "plan college interest death experience effect class control care field development "
          "role effort rate heart drug show leader light voice wife police mind price report "
          "decision son view relationship town road arm difference value building action model "
          "season society tax director position player record paper space ground form event "
          "official matter center couple site project activity star table need court oil "
          "situation cost industry figure street image phone data picture practice piece land "
          "product doctor wall patient worker news test movie north love support technology step "
          "baby computer type attention film tree source organization hair window evidence "
          "population site truth green blue river stone glass bread cloud garden summer winter").split()


@dataclass
class RequestResult:
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    output_tokens: int
    prompt_tokens: int
    throughput_tok_s: float  # generated tokens / wall time
    requests_per_s: float
    ttft_s: dict  # p50/p95/p99
    itl_s: dict
    e2e_s: dict
    first_error: str | None = None


def percentiles(xs) -> dict:
    """p50/p95/p99 of xs (None each when xs is empty)."""
    if not xs:
        return {"p50": None, "p95": None, "p99": None}
    a = np.asarray(xs, dtype=np.float64)
    return {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)}


def make_prompts(n: int, prompt_tokens: int, shared_prefix_tokens: int = 0, seed: int = 0) -> list[str]:
    """n prompts of about prompt_tokens words; the first shared_prefix_tokens words are common."""
    rng = random.Random(seed)
    shared = [rng.choice(_WORDS) for _ in range(min(shared_prefix_tokens, prompt_tokens))]
    out = []
    for _ in range(n):
        own = [rng.choice(_WORDS) for _ in range(prompt_tokens - len(shared))]
        out.append(" ".join(shared + own))
    return out


async def _one(client, url: str, headers: dict, body: dict) -> RequestResult:
    t0 = time.perf_counter()
    res = RequestResult(ok=False)
    last = None
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                res.error = f"HTTP {r.status_code}: {text[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = f"stream error: {obj['error']}"[:300]
                    return res
                now = time.perf_counter()
                for ch in obj.get("choices") or ():
                    if ch.get("text") or ch.get("delta", {}).get("content"):
                        chunks += 1
                        if res.ttft_s is None:
                            res.ttft_s = now - t0
                        else:
                            res.itl_s.append(now - last)
                        last = now
                u = obj.get("usage")
                if u:
                    res.prompt_tokens = u.get("prompt_tokens")
                    res.output_tokens = u.get("completion_tokens") or 0
    except Exception as e:  # counted as an error, the run goes on
        res.error = f"{type(e).__name__}: {e}"[:300]
        return res
    res.e2e_s = time.perf_counter() - t0
    res.output_tokens = res.output_tokens or chunks
    res.ok = res.ttft_s is not None
    if not res.ok:
        res.error = "no tokens received"
    return res


async def run_level(base_url: str, concurrency: int, prompts: list[str], gen_tokens: int, *,
                    api_key: str | None = None, model: str | None = None,
                    timeout_s: float = 600.0) -> LevelResult:
    """Send every prompt with `concurrency` requests in flight; returns the level's figures."""
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    body_base = {"max_tokens": gen_tokens, "temperature": 0.0, "stream": True,
                 "stream_options": {"include_usage": True}, "ignore_eos": True}
    if model:
        body_base["model"] = model
    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def worker():
            while True:
                try:
                    p = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results.append(await _one(client, url, headers, body_base | {"prompt": p}))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    good = [r for r in results if r.ok]
    errors = [r for r in results if not r.ok]
    out_tokens = sum(r.output_tokens for r in good)
    return LevelResult(
        concurrency=concurrency, requests=len(results), errors=len(errors), duration_s=wall,
        output_tokens=out_tokens, prompt_tokens=sum(r.prompt_tokens or 0 for r in good),
        throughput_tok_s=out_tokens / wall if wall > 0 else 0.0,
        requests_per_s=len(good) / wall if wall > 0 else 0.0,
        ttft_s=percentiles([r.ttft_s for r in good]), itl_s=percentiles([x for r in good for x in r.itl_s]),
        e2e_s=percentiles([r.e2e_s for r in good]), first_error=errors[0].error if errors else None)


def run(base_url: str, levels=(1, 4, 16), *, requests: int | None = None, prompt_tokens: int = 128,
        gen_tokens: int = 64, shared_prefix_tokens: int = 0, api_key: str | None = None,
        model: str | None = None, warmup: bool = True, seed: int = 0) -> list[LevelResult]:
    """Run each concurrency level in turn (requests per level: given, else 2 x concurrency, >= 4)."""

    async def main():
        if warmup:  # compile / page-in before timing anything
            await run_level(base_url, 1, make_prompts(1, prompt_tokens, 0, seed + 999), 4,
                            api_key=api_key, model=model)
        out = []
        for i, c in enumerate(levels):
            n = requests if requests else max(4, 2 * c)
            prompts = make_prompts(n, prompt_tokens, shared_prefix_tokens, seed + i)
            out.append(await run_level(base_url, c, prompts, gen_tokens, api_key=api_key,
                                       model=model))
        return out

    return asyncio.run(main())


def format_table(results: list[LevelResult]) -> str:
    """A fixed-width table, one row per concurrency level (latencies in ms)."""

    def ms(d, k):
        return "-" if d[k] is None else f"{d[k] * 1000:.0f}"

    head = (f"{'conc':>4} {'reqs':>5} {'err':>4} {'tok/s':>8} {'req/s':>6} "
            f"{'ttft p50':>8} {'p95':>6} {'p99':>6} {'itl p50':>7} {'p95':>6} {'p99':>6} {'e2e p50':>8}")
    rows = [head]
    for r in results:
        rows.append(f"{r.concurrency:>4} {r.requests:>5} {r.errors:>4} {r.throughput_tok_s:>8.1f} "
                     f"{r.requests_per_s:>6.2f} {ms(r.ttft_s, 'p50'):>8} {ms(r.ttft_s, 'p95'):>6} "
                     f"{ms(r.ttft_s, 'p99'):>6} {ms(r.itl_s, 'p50'):>7} {ms(r.itl_s, 'p95'):>6} "
                     f"{ms(r.itl_s, 'p99'):>6} {ms(r.e2e_s, 'p50'):>8}")
    errs = [f"  c={r.concurrency}: {r.first_error}" for r in results if r.first_error]
    if errs:
        rows += ["first error per level:"] + errs
    return "\n".join(rows)


def as_json(results: list[LevelResult]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2)
