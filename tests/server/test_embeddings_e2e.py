"""A real `edged serve` on the default model, driven by the official `openai` client (issue 16):
embeddings of 64 inputs (base64, the client's default, and float), 'a cat' closer to 'a kitten'
than to 'the stock market', and the lm-evaluation-harness loglikelihood request
(max_tokens 0, echo, logprobs 1) that was a 400 before."""

import numpy as np
import pytest

openai = pytest.importorskip("openai")  # the dev extra

from tests.helpers.model import default_model_path
from tests.server.server_proc import running_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server([str(default_model_path()), "--ctx", "512", "--max-seqs", "8", "--log-level", "warning"],
                        tmp_path_factory.mktemp("emb") / "serve.log") as proc:
        yield proc


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _model(client) -> str:
    return client.models.list().data[0].id


def test_64_inputs_and_similarity(client, server):
    model = _model(client)
    texts = ["a cat", "a kitten", "the stock market"] + [f"sentence number {i} about topic {i % 7}" for i in range(61)]
    r = client.embeddings.create(model=model, input=texts)  # the client asks for base64 and decodes it
    assert len(r.data) == 64 and [d.index for d in r.data] == list(range(64))
    vecs = np.array([d.embedding for d in r.data])
    assert vecs.shape == (64, 640)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-4)
    cat, kitten, stocks = vecs[:3]
    assert cat @ kitten > cat @ stocks, (cat @ kitten, cat @ stocks)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 64
    floats = client.embeddings.create(model=model, input=texts[:3], encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in floats.data], vecs[:3], rtol=1e-5, atol=1e-6)
    short = client.embeddings.create(model=model, input="a cat", dimensions=64, encoding_format="float")
    assert len(short.data[0].embedding) == 64
    m = server.metrics()
    assert m["edged_embedding_inputs_total"] >= 68 and m["edged_kv_blocks_used"] == 0


def test_lm_eval_loglikelihood_request(client):
    """As lm-evaluation-harness's local-completions model sends it."""
    model = _model(client)
    r = client.completions.create(model=model, prompt="The capital of France is Paris", max_tokens=0,
                                  echo=True, logprobs=1)
    c = r.choices[0]
    assert c.text == "The capital of France is Paris" and c.finish_reason == "length"
    lp = c.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.prompt_tokens
    assert all(x <= 0 for x in lp.token_logprobs[1:]) and all(len(t) == 1 for t in lp.top_logprobs[1:])
    assert r.usage.completion_tokens == 0
    # vLLM's field through extra_body
    v = client.completions.create(model=model, prompt="The capital of France is", max_tokens=1,
                                  extra_body={"prompt_logprobs": 2}, temperature=0)
    entries = v.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == v.usage.prompt_tokens
    assert all({"logprob", "rank", "decoded_token"} <= set(e) for d in entries[1:] for e in d.values())


def test_bad_embedding_requests_name_the_field(client):
    model = _model(client)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model, input=["ok", "word " * 600])
    assert e.value.body["param"] == "input[1]"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model, input="x", dimensions=641)
    assert e.value.body["param"] == "dimensions"
