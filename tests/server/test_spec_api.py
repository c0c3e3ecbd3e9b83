"""`edged serve --spec ngram` in process (TestClient, the real engine over a stand-in model whose
next token is a function of the last, so drafts from a prompt holding its chain are accepted):
the same replies with and without the per-request opt-out, the `speculative` field validated on
the OpenAI-shaped routes, and the draft counters in /metrics."""

import os
import re

import pytest
from starlette.testclient import TestClient

from edged.loader import load
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.lifecycle import ServerState
from tests.helpers.tiny_models import write_tiny_model
from tests.server.stub_model import StubModel

COMP = "/v1/completions"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tiny = load(str(write_tiny_model(tmp_path_factory.mktemp("spec") / "tiny.gguf", "llama")),
                warmup=False, quiet=True)
    state = ServerState(ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4,
                                     spec="ngram", spec_max=4))
    app = create_app(state, load_in_background=False)
    model = StubModel(tiny.tokenizer.vocab_size)
    state.attach(model, tiny.tokenizer, tiny.chat, str(tiny.path))
    with TestClient(app, base_url="http://localhost") as c:
        yield c, model


def _metric(text: str, name: str) -> float:
    return float(re.search(rf'^{name}{{model="tiny"}} (\S+)$', text, re.M).group(1))


def test_spec_replies_equal_opted_out_ones_and_metrics_count_drafts(served):
    client, model = served
    chain = [9]  # it cycles after 18 tokens: every token after the first is drafted
    while len(chain) < 30:
        chain.append(model.next_token(chain[-1]))
    body = {"prompt": chain, "max_tokens": 20, "temperature": 0}
    off = client.post(COMP, json={**body, "speculative": False}).json()
    m0 = client.get("/metrics").text
    assert _metric(m0, "edged_spec_draft_tokens_total") == 0.0
    on = client.post(COMP, json=body).json()
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    assert on["usage"] == off["usage"] and on["usage"]["completion_tokens"] == 20
    m = client.get("/metrics").text
    drafted = _metric(m, "edged_spec_draft_tokens_total")
    assert drafted >= 12  # 19 tokens after the first: 2 drafted, then 4 a step
    assert _metric(m, "edged_spec_accepted_tokens_total") == drafted  # the stand-in never misses
    assert _metric(m, "edged_spec_acceptance_ratio") == 1.0


@pytest.mark.parametrize("path,body", [
    (COMP, {"prompt": "a", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2}),
    ("/v1/responses", {"input": "a", "max_output_tokens": 2}),
])
def test_speculative_field_is_a_boolean(served, path, body):
    client, _ = served
    assert client.post(path, json={**body, "speculative": False}).status_code == 200
    r = client.post(path, json={**body, "speculative": "no"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative", r.text


# -- --draft: a draft model loaded beside MODEL ---------------------------------------------------


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft")
    return (str(write_tiny_model(d / "target.gguf", "llama")),
            str(write_tiny_model(d / "other.gguf", "qwen2")))  # another vocabulary


def _draft_config(target: str, draft: str, **kw) -> ServerConfig:
    return ServerConfig(model=target, ctx=256, max_seqs=4, block_size=4, warmup=False, spec="draft",
                        draft=draft, draft_p_min=0.0, **kw)


def test_a_draft_model_is_loaded_with_model_and_its_drafts_count(tiny_files):
    target, _ = tiny_files
    state = ServerState(_draft_config(target, target))  # the model as its own draft: all accepted
    state.load()
    assert state.status == "ready", state.error
    # the draft's file, KV pool and workspace count in the model's memory (--max-memory, ps)
    est = state.models.loaded()[0].estimate
    engine = state.models.loaded()[0].engine
    assert est.draft > os.path.getsize(target) + engine.spec.kv_bytes > os.path.getsize(target)
    assert est.total == est.weights + est.kv + est.workspace + est.draft and "draft model" in est.describe()
    with TestClient(create_app(state, load_in_background=False), base_url="http://localhost") as c:
        body = {"prompt": "one two three", "max_tokens": 12, "temperature": 0}
        off = c.post(COMP, json={**body, "speculative": False}).json()
        on = c.post(COMP, json=body).json()
        assert on["choices"][0]["text"] == off["choices"][0]["text"]
        m = c.get("/metrics").text
        drafted = float(re.search(r'^edged_spec_draft_tokens_total{model="target"} (\S+)$', m, re.M).group(1))
        assert drafted >= 8  # 11 tokens after the first, up to 8 a step
        assert float(re.search(r'^edged_spec_acceptance_ratio{model="target"} (\S+)$', m, re.M).group(1)) == 1.0


def test_a_draft_with_another_vocabulary_fails_the_load(tiny_files):
    target, other = tiny_files
    state = ServerState(_draft_config(target, other))
    state.load()
    assert state.status == "failed" and "VocabularyMismatch" in state.error and other in state.error


@pytest.mark.parametrize("kw, message", [
    ({"spec": "draft"}, "--draft"),
    ({"draft": "x.gguf"}, "--draft"),
    ({"spec": "draft", "draft": "x.gguf", "draft_p_min": 1.5}, "--draft-p-min"),
])
def test_draft_settings_are_validated(kw, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(model="m.gguf", **kw).validate()


def test_serve_without_model_refuses_a_draft():
    from click.testing import CliRunner

    from edged.cli import main

    r = CliRunner().invoke(main, ["serve", "--draft", "x.gguf"])
    assert r.exit_code == 2 and "--draft needs MODEL" in r.output, r.output
