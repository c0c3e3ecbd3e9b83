"""Prompt log-probabilities over HTTP (issue 16 item 4), in process on a tiny real model: OpenAI's
legacy echo + logprobs (also max_tokens 0, the lm-evaluation-harness request), streamed echo, and
vLLM's prompt_logprobs on completions and chat."""

import json

import numpy as np
import pytest
from starlette.testclient import TestClient

from edged.loader import load
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.lifecycle import ServerState
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import Seq, ShuffledBlocks, log_softmax, make_batch

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
IDS = list(range(5, 40))  # 35 token ids


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("plp") / "tiny.gguf", "llama")
    return load(str(path), warmup=False, quiet=True)


@pytest.fixture(scope="module")
def client(tiny):
    state = ServerState(ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4))
    app = create_app(state, load_in_background=False)
    state.attach(tiny.model, tiny.tokenizer, tiny.chat, str(tiny.path))
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def teacher_forced(model, ids) -> np.ndarray:
    """float64 [len(ids), vocab] log-softmax of one all-rows forward."""
    nb = -(-len(ids) // 4)
    kv = model.allocate_kv(nb, 4)
    return log_softmax(model.forward(make_batch([Seq()], [ids], ShuffledBlocks(nb), 4, all_logits=True), kv))


def test_echo_logprobs_max_tokens_zero(client, tiny):
    """The lm-evaluation-harness loglikelihood request: prompt ids, max_tokens 0, echo, logprobs 1."""
    r = client.post(COMP, json={"prompt": IDS, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "length" and c["text"] == tiny.tokenizer.decode(IDS)
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(IDS)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"] == [tiny.tokenizer.token_bytes(t, False).decode("utf-8", "replace") for t in IDS]
    ref = teacher_forced(tiny.model, IDS)
    np.testing.assert_allclose(lp["token_logprobs"][1:], [ref[p - 1][IDS[p]] for p in range(1, len(IDS))],
                               atol=1e-4)
    assert all(len(t) == 1 for t in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert r.json()["usage"] == {"prompt_tokens": len(IDS), "completion_tokens": 0, "total_tokens": len(IDS)}


def test_echo_logprobs_then_completion(client):
    body = {"prompt": IDS, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2}
    c = client.post(COMP, json=body).json()["choices"][0]
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(IDS) + 4
    assert lp["token_logprobs"][0] is None and None not in lp["token_logprobs"][1:]
    assert all(1 <= len(t) <= 2 for t in lp["top_logprobs"][1:])  # keyed by text: byte tokens may share one
    plain = client.post(COMP, json={**body, "echo": False}).json()["choices"][0]
    assert c["text"].endswith(plain["text"]) and lp["token_logprobs"][len(IDS):] == plain["logprobs"]["token_logprobs"]
    assert lp["text_offset"][len(IDS)] == len(c["text"]) - len(plain["text"])  # after the echo


def test_streamed_echo_carries_the_prompt_logprobs(client):
    body = {"prompt": IDS, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    whole = client.post(COMP, json=body).json()["choices"][0]
    events = []
    with client.stream("POST", COMP, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    first = events[0]["choices"][0]
    assert first["text"] == whole["text"][: len(first["text"])] and len(first["logprobs"]["tokens"]) == len(IDS)
    logged = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    assert [x for lp in logged for x in lp["token_logprobs"]] == whole["logprobs"]["token_logprobs"]
    assert [x for lp in logged for x in lp["tokens"]] == whole["logprobs"]["tokens"]
    assert [x for lp in logged for x in lp["text_offset"]] == whole["logprobs"]["text_offset"]
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]


def _check_vllm(entries, ids, k, model):
    ref = teacher_forced(model, ids)
    assert entries[0] is None and len(entries) == len(ids)
    for p in range(1, len(ids)):
        e, row = entries[p], ref[p - 1]
        me = e[str(ids[p])]
        assert me["logprob"] == pytest.approx(row[ids[p]], abs=1e-4)
        assert me["rank"] == 1 + int(np.sum(row > row[ids[p]]))
        assert isinstance(me["decoded_token"], str)
        best = [str(t) for t in np.argsort(-row, kind="stable")[:k]]
        assert set(best) <= set(e) and len(e) in (k, k + 1)
        assert [e[t]["rank"] for t in best] == list(range(1, k + 1))


def test_vllm_prompt_logprobs_on_completions(client, tiny):
    r = client.post(COMP, json={"prompt": IDS, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 3})
    c = r.json()["choices"][0]
    _check_vllm(c["prompt_logprobs"], IDS, 3, tiny.model)
    assert c["logprobs"] is None  # only what was asked


def test_vllm_prompt_logprobs_on_chat(client, tiny):
    msgs = [{"role": "user", "content": "hello there"}]
    r = client.post(CHAT, json={"messages": msgs, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tiny.tokenizer.encode(tiny.chat.render(msgs, add_generation_prompt=True), add_special=True,
                                parse_special=True)
    _check_vllm(body["prompt_logprobs"], ids, 0, tiny.model)
    assert "prompt_logprobs" not in client.post(CHAT, json={"messages": msgs, "max_tokens": 1}).json()


def test_errors_name_the_field(client):
    for body, field in [({"prompt": "a", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
                        ({"prompt": "a", "prompt_logprobs": -1}, "prompt_logprobs"),
                        ({"prompt": "a", "max_tokens": -1}, "max_tokens")]:
        r = client.post(COMP, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"  # 0 is completions' only


def test_blocks_free_afterwards(client):
    client.post(COMP, json={"prompt": IDS, "max_tokens": 0, "echo": True, "logprobs": 1})
    s = client.app.state.edged.models.resolve(None).engine.stats()
    assert s.running == 0 and s.waiting == 0 and s.blocks_used == 0
