"""`edged serve --spec ngram` in process (TestClient, the real engine over a stand-in model whose
next token is a function of the last, so drafts from a prompt holding its chain are accepted):
the same replies with and without the per-request opt-out, the `speculative` field validated on
the OpenAI-shaped routes, and the draft counters in /metrics."""

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
