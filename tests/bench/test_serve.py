"""`edged bench serve` against a live uvicorn server (stub model, real engine) in a thread."""

import json
import threading
import time

import pytest
import uvicorn
from click.testing import CliRunner

from edged.bench import serve as bench_serve
from edged.cli.bench_serve import command as bench_serve_command
from edged.loader import load
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.lifecycle import ServerState
from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import free_port
from tests.server.stub_model import StubModel


@pytest.fixture(scope="module")
def live_url(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("bench") / "tiny.gguf", "gemma3", context=512)
    lm = load(str(path), warmup=False, quiet=True)
    port = free_port()
    state = ServerState(ServerConfig(model=str(path), port=port, ctx=512, max_seqs=4, block_size=4))
    app = create_app(state, load_in_background=False)
    state.attach(StubModel(lm.tokenizer.vocab_size, context_length=512, delay_s=0.002),
                 lm.tokenizer, lm.chat, str(path))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    t.join(10)


def test_prompts_share_prefix():
    ps = bench_serve.make_prompts(3, 20, shared_prefix_tokens=8, seed=1)
    words = [p.split() for p in ps]
    assert all(len(w) == 20 for w in words)
    assert words[0][:8] == words[1][:8] == words[2][:8]
    assert words[0][8:] != words[1][8:]


@pytest.mark.e2e
def test_levels_report_exact_token_counts(live_url):
    res = bench_serve.run(live_url, (1, 3), requests=6, prompt_tokens=12, gen_tokens=5,
                          shared_prefix_tokens=4, warmup=False)
    assert [r.concurrency for r in res] == [1, 3]
    for r in res:
        assert r.requests == 6 and r.errors == 0
        assert r.output_tokens == 6 * 5  # ignore_eos: every request generates exactly gen_tokens
        assert r.prompt_tokens > 0 and r.throughput_tok_s > 0
        assert 0 < r.ttft_s["p50"] <= r.ttft_s["p95"] <= r.ttft_s["p99"]
        assert r.itl_s["p50"] is not None
    assert "ttft p50" in bench_serve.format_table(res)


@pytest.mark.e2e
def test_cli_json_and_errors(live_url):
    out = CliRunner().invoke(bench_serve_command, ["--url", live_url, "--concurrency", "2",
                                                   "--requests", "2", "--prompt-tokens", "6",
                                                   "--gen-tokens", "3", "--no-warmup", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data[0]["concurrency"] == 2 and data[0]["errors"] == 0
    # a request the server rejects counts as an error, with its message
    bad = bench_serve.run(live_url, (1,), requests=1, prompt_tokens=4, gen_tokens=5000,
                          warmup=False)
    assert bad[0].errors == 1 and "HTTP 400" in bad[0].first_error


def test_edged_bench_serve_is_wired_into_the_cli():
    from edged.cli import main

    out = CliRunner().invoke(main, ["bench", "serve", "--help"])
    assert out.exit_code == 0, out.output
    assert "bench serve [OPTIONS]" in out.output and "--concurrency" in out.output
