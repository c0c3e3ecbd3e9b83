"""Fast in-process server tests: starlette's TestClient over the real app, engine and tokenizer
(of a tiny GGUF), with a stub model instead of kernels, so no JIT compile is needed."""

import json

import pytest
from starlette.testclient import TestClient

from edged.loader import load
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.errors import APIError, error_body, to_api_error
from edged.server.lifecycle import ServerState
from edged.server.security import check_api_key, host_name
from tests.helpers.tiny_models import write_tiny_model
from tests.server.malformed import MALFORMED
from tests.server.stub_model import StubModel

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("srv") / "tiny.gguf", "gemma3")
    return load(str(path), warmup=False, quiet=True)


def _client(tiny, **cfg):
    config = ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4, **cfg)
    state = ServerState(config)
    app = create_app(state, load_in_background=False)
    state.attach(StubModel(tiny.tokenizer.vocab_size), tiny.tokenizer, tiny.chat, str(tiny.path))
    return TestClient(app, base_url="http://localhost")


@pytest.fixture(scope="module")
def client(tiny):
    with _client(tiny) as c:
        yield c


def _stream(client, path, body):
    """Parsed SSE events (JSON objects; the final [DONE] checked and dropped)."""
    events = []
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# -- units -----------------------------------------------------------------------------------------

def test_error_body_shape():
    assert error_body(400, "bad", "n", "x") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": "x"}}
    assert to_api_error(ValueError("v")).status == 400
    assert to_api_error(json.JSONDecodeError("m", "d", 0)).status == 400
    assert to_api_error(RuntimeError("boom")).status == 500
    e = APIError(503, "busy", headers={"Retry-After": "1"})
    assert to_api_error(e) is e


def test_host_name_and_keys():
    assert host_name("LOCALHOST:8080") == "localhost"
    assert host_name("[::1]:80") == "[::1]"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert check_api_key("k1", ("k0", "k1"))
    assert not check_api_key("k", ("k0", "k1"))
    assert not check_api_key(None, ("k",))


@pytest.mark.parametrize("host,key,insecure,ok", [
    ("127.0.0.1", None, False, True), ("localhost", None, False, True), ("::1", None, False, True),
    ("0.0.0.0", None, False, False), ("0.0.0.0", "k", False, True), ("0.0.0.0", None, True, True),
    ("192.168.1.5", None, False, False)])
def test_non_loopback_bind_needs_a_key(host, key, insecure, ok):
    c = ServerConfig(host=host, api_keys=(key,) if key else (), insecure=insecure)
    if ok:
        c.validate()
    else:
        with pytest.raises(ValueError, match="API key"):
            c.validate()


# -- endpoints -------------------------------------------------------------------------------------

def test_health_models_metrics(client):
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"
    text = client.get("/metrics").text
    for name in ("edged_requests_running", "edged_requests_waiting", "edged_prompt_tokens_total",
                 "edged_generation_tokens_total", "edged_kv_usage_ratio",
                 "edged_prefix_cache_hit_ratio", "edged_preemptions_total",
                 "edged_time_to_first_token_seconds_bucket", "edged_inter_token_latency_seconds_bucket",
                 "edged_e2e_request_latency_seconds_bucket"):
        assert name in text


def test_health_503_while_loading(tiny):
    state = ServerState(ServerConfig())
    app = create_app(state, load_in_background=False)
    with TestClient(app, base_url="http://localhost") as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and "retry-after" in r.headers
        assert r.json()["error"]["type"] == "service_unavailable"


def test_completion_greedy_stream_equals_nonstream(client, tiny):
    body = {"prompt": "héllo 😀 世界", "max_tokens": 12, "temperature": 0}
    full = client.post(COMP, json=body).json()
    ev = _stream(client, COMP, body)
    streamed = "".join(c["text"] for e in ev for c in e["choices"])
    assert streamed == full["choices"][0]["text"]
    assert full["choices"][0]["finish_reason"] == "length"
    assert ev[-1]["choices"][0]["finish_reason"] == "length"
    n_prompt = len(tiny.tokenizer.encode(body["prompt"]))
    assert full["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 12,
                             "total_tokens": n_prompt + 12}


def test_chat_stream_usage_and_role(client, tiny):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
            "stream_options": {"include_usage": True}}
    ev = _stream(client, CHAT, body)
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["object"] == "chat.completion.chunk" for e in ev)
    assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 5
    assert all(e["usage"] is None for e in ev[:-1])
    text = tiny.chat.render(body["messages"])
    assert ev[-1]["usage"]["prompt_tokens"] == len(tiny.tokenizer.encode(text))
    full = client.post(CHAT, json=body | {"stream_options": None}).json()
    assert full["choices"][0]["message"]["content"] == "".join(
        c["delta"].get("content", "") for e in ev for c in e["choices"])


def test_developer_message_renders_as_system(client, tiny):
    """OpenAI's "developer" role is accepted and given to the template as "system"."""
    def prompt_tokens(role):
        body = {"messages": [{"role": role, "content": "be brief"}, {"role": "user", "content": "hi"}],
                "max_tokens": 1}
        r = client.post(CHAT, json=body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    system = tiny.chat.render([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert prompt_tokens("developer") == prompt_tokens("system") == len(tiny.tokenizer.encode(system))


def test_prompt_forms_and_echo(client, tiny):
    ids = tiny.tokenizer.encode("abc")
    body = {"max_tokens": 3, "temperature": 0}
    r = client.post(COMP, json=body | {"prompt": [ids, ids], "n": 2}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    texts = [c["text"] for c in r["choices"]]
    assert r["usage"]["prompt_tokens"] == 2 * len(ids)
    assert r["usage"]["completion_tokens"] == 12
    r = client.post(COMP, json=body | {"prompt": ["abc", "abc"]}).json()
    texts += [c["text"] for c in r["choices"]]
    texts.append(client.post(COMP, json=body | {"prompt": ids}).json()["choices"][0]["text"])
    assert len(texts) == 7 and len(set(texts)) == 1  # one prompt in four forms, greedy
    e = client.post(COMP, json={"prompt": "abc", "max_tokens": 3, "temperature": 0, "echo": True}).json()
    assert e["choices"][0]["text"] == "abc" + texts[0]


def test_logprobs_shapes(client):
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                                "temperature": 0, "logprobs": True, "top_logprobs": 2}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for item in content:
        assert item["logprob"] <= 0 and len(item["top_logprobs"]) == 2
        assert item["top_logprobs"][0]["token"] == item["token"]  # greedy picks the best
        assert isinstance(item["bytes"], list)
    r = client.post(COMP, json={"prompt": "x", "max_tokens": 4, "temperature": 0, "logprobs": 1}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 4
    assert all(len(t) == 1 for t in lp["top_logprobs"])


def test_stop_string_cuts_text(client):
    body = {"prompt": "abc", "max_tokens": 10, "temperature": 0}
    text = client.post(COMP, json=body).json()["choices"][0]["text"]
    stop = text[3:5]
    assert stop
    r = client.post(COMP, json=body | {"stop": stop}).json()["choices"][0]
    assert r["finish_reason"] == "stop"
    assert r["text"] == text[: text.index(stop)]


def test_seeded_sampling_repeats(client):
    body = {"prompt": "abc", "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 3}
    a = [c["text"] for c in client.post(COMP, json=body).json()["choices"]]
    b = [c["text"] for c in client.post(COMP, json=body).json()["choices"]]
    assert a == b


def test_tokenize_detokenize(client, tiny):
    r = client.post("/tokenize", json={"content": "hello world"}).json()
    assert r["tokens"] == tiny.tokenizer.encode("hello world", add_special=False)
    r2 = client.post("/tokenize", json={"content": "hello", "with_pieces": True}).json()
    assert all({"id", "piece"} <= set(t) for t in r2["tokens"])
    d = client.post("/detokenize", json={"tokens": r["tokens"]}).json()
    assert d["content"] == tiny.tokenizer.decode(r["tokens"])


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_requests(client, case):
    name, method, path, body, status = case
    if isinstance(body, (bytes, type(None))):
        r = client.request(method, path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.request(method, path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    ok = client.post(COMP, json={"prompt": "a", "max_tokens": 1})
    assert ok.status_code == 200


def test_transport_level_rejections(tiny):
    with _client(tiny, max_body_bytes=1000) as c:
        r = c.post(COMP, content=b'{"prompt": "' + b"a" * 2000 + b'"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        assert c.get("/health", headers={"host": "evil.example"}).status_code == 400
        assert c.get("/health", headers={"host": ""}).status_code == 400
        assert c.get("/health", headers={"x-big": "a" * 20000}).status_code == 431
        assert c.get("/health").status_code == 200


def test_api_key(tiny):
    with _client(tiny, api_keys=("sekrit",)) as c:
        assert c.get("/health").status_code == 200  # probes need no key
        r = c.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/models", headers={"authorization": "Basic sekrit"}).status_code == 401
        assert c.get("/v1/models", headers={"authorization": "Bearer sekrit"}).status_code == 200
        assert c.get("/v1/models", headers={"x-api-key": "sekrit"}).status_code == 200


def test_cors_only_when_configured(tiny, client):
    pre = {"origin": "http://app.example", "access-control-request-method": "POST"}
    r = client.options(CHAT, headers=pre)
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in client.get("/v1/models", headers={
        "origin": "http://app.example"}).headers
    with _client(tiny, cors_origins=("http://app.example",), allowed_hosts=("myhost",)) as c:
        r = c.options(CHAT, headers=pre)
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        r = c.get("/v1/models", headers={"origin": "http://other.example"})
        assert "access-control-allow-origin" not in r.headers
        assert c.get("/health", headers={"host": "myhost:8080"}).status_code == 200


def test_queue_full_is_503(tiny):
    with _client(tiny, max_queue=0) as c:  # room for max_seqs=4 sequences only
        r = c.post(COMP, json={"prompt": "a", "max_tokens": 1, "n": 5})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert c.post(COMP, json={"prompt": "a", "max_tokens": 1, "n": 4}).status_code == 200


def test_engine_blocks_free_after_requests(client):
    client.post(COMP, json={"prompt": "abc", "max_tokens": 3})
    st = client.app.state.edged.models.resolve("tiny")
    assert st.in_flight == 0 and st.holds == 0
    s = st.engine.stats()
    assert s.running == 0 and s.waiting == 0 and s.blocks_free == s.blocks_total


class _NaNStub(StubModel):
    """Logits that are never finite: the engine's non-finite guard fails each request (issue 18)."""

    def forward(self, batch, kv):
        logits = super().forward(batch, kv)
        logits[:, 5] = float("nan")
        return logits


def test_nonfinite_logits_are_a_500_and_an_error_event(tiny):
    state = ServerState(ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4))
    app = create_app(state, load_in_background=False)
    state.attach(_NaNStub(tiny.tokenizer.vocab_size), tiny.tokenizer, tiny.chat, str(tiny.path))
    why = "logits are not finite (NaN or inf) at position 1; the model file or its metadata is broken"
    with TestClient(app, base_url="http://localhost") as c:
        body = {"prompt": [5, 6], "max_tokens": 3}  # token ids: the first sampled row is at position 1
        r = c.post(COMP, json=body)
        assert r.status_code == 500 and r.json()["error"]["message"] == f"generation failed: {why}"
        events = _stream(c, COMP, body)
        assert [e["error"]["message"] for e in events if "error" in e] == [f"generation failed: {why}"]
        assert 'edged_nonfinite_logits_total{model="tiny"} 2.0' in c.get("/metrics").text
