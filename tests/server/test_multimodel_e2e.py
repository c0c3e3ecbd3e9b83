"""Issue 15's acceptance: one `edged serve` (no MODEL) serving Gemma 3 270M and SmolLM2 135M from
a temporary store: alternating greedy requests keep each model's own tokens, keep_alive 0 gives
the weights back (the process RSS falls by at least the file's size), --max-loaded-models 1
evicts the idle model."""

import time
from pathlib import Path

import httpx
import pytest

from edged.store import ModelStore
from tests.helpers.model import SMOLLM2, default_model_path, smollm2_path
from tests.server.server_proc import running_server

pytestmark = pytest.mark.e2e

G, S = "gemma3-270m:latest", SMOLLM2


@pytest.fixture(scope="module")
def store_env(tmp_path_factory):
    """EDGED_MODELS pointing at a store holding both models (for the server subprocesses)."""
    root = tmp_path_factory.mktemp("multi") / "store"
    gemma, smol = default_model_path(), smollm2_path()
    st = ModelStore(root)
    st.import_path(gemma, name=G)
    st.import_path(smol, name=S)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGED_MODELS", str(root))
        yield {G: gemma.stat().st_size, S: smol.stat().st_size}


def _serve(tmp_path, *args):
    return running_server(["--ctx", "512", "--max-seqs", "2", "--max-batch-tokens", "128", *args],
                          tmp_path / "serve.log")


def _complete(server, model, **kw) -> tuple[str, list]:
    """Greedy text and tokens of a fixed prompt."""
    r = httpx.post(f"{server.url}/v1/completions", timeout=600, json={
        "model": model, "prompt": "The three primary colours are", "max_tokens": 12,
        "temperature": 0, "ignore_eos": True, "logprobs": 0, **kw})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert r.json()["model"] == model
    return ch["text"], ch["logprobs"]["tokens"]


def _status(server) -> dict:
    return {m["id"]: m["status"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]}


def _wait_status(server, model, status, timeout=60):
    deadline = time.monotonic() + timeout
    while _status(server)[model] != status:
        assert time.monotonic() < deadline, f"{model} still {_status(server)[model]}"
        time.sleep(0.1)


def _total(metrics_text: str, name: str) -> float:
    """The sum of a metric's samples over all its labels."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
               if line.startswith(name + "{"))


def _rss(server) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_alternating_models_and_keep_alive_zero_returns_the_memory(store_env, tmp_path):
    with _serve(tmp_path, "--max-loaded-models", "2") as server:
        assert _status(server) == {G: "unloaded", S: "unloaded"}
        alone = {G: _complete(server, G, keep_alive=0)}  # served alone, then unloaded
        _wait_status(server, G, "unloaded")
        alone[S] = _complete(server, S)
        assert alone[G] != alone[S]
        for _ in range(3):
            for m in (G, S):
                assert _complete(server, m) == alone[m]
        assert _status(server) == {G: "loaded", S: "loaded"}
        before = _rss(server)
        _complete(server, G, keep_alive=0)
        _wait_status(server, G, "unloaded")
        after = _rss(server)
        assert before - after >= store_env[G], (before, after, store_env[G])
        assert _complete(server, S) == alone[S]  # the other model kept serving
        text = httpx.get(f"{server.url}/metrics").text
        assert "edged_models_loaded 1.0" in text
        assert _total(text, "edged_model_unloads_total") == 2  # G twice, by keep_alive 0
        assert _total(text, "edged_model_loads_total") == 3
        assert server.metrics()["edged_generation_tokens_total"] > 0  # S's engine series


def test_max_loaded_models_one_evicts_the_idle_model(store_env, tmp_path):
    with _serve(tmp_path, "--max-loaded-models", "1") as server:
        g = _complete(server, G)
        _complete(server, S)
        assert _status(server) == {G: "unloaded", S: "loaded"}
        assert _complete(server, G) == g
        assert _status(server) == {G: "loaded", S: "unloaded"}
        text = httpx.get(f"{server.url}/metrics").text
        assert f'edged_model_unloads_total{{model="{G}",reason="evicted"}} 1.0' in text
        assert f'edged_model_unloads_total{{model="{S}",reason="evicted"}} 1.0' in text
        log = server.log_tail(20000)
        assert f"unloaded {G} (evicted, to make room for {S})" in log
