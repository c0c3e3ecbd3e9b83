"""/v1/embeddings in process on a tiny real model (issue 16 item 1): OpenAI's shape for every
input form, pooling from the file or --pooling, normalisation, dimensions, base64, limits and
malformed bodies as 4xx naming the field, /metrics counters, KV all free afterwards."""

import base64

import gguf
import numpy as np
import pytest
from starlette.testclient import TestClient

from edged.engine.pooling import normalize
from edged.loader import load
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.lifecycle import ServerState
from edged.server.schemas import MAX_EMBEDDING_INPUTS
from tests.helpers.tiny_models import write_tiny_model
from tests.models.driver import Seq, ShuffledBlocks, make_batch

EMB = "/v1/embeddings"


def _load(tmp_path_factory, name, **options):
    path = write_tiny_model(tmp_path_factory.mktemp("emb") / f"{name}.gguf", "gemma3", **options)
    return load(str(path), warmup=False, quiet=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _load(tmp_path_factory, "tiny")


def _client(lm, **cfg):
    state = ServerState(ServerConfig(model=str(lm.path), ctx=64, max_seqs=4, block_size=4,
                                     max_batch_tokens=32, **cfg))
    app = create_app(state, load_in_background=False)
    state.attach(lm.model, lm.tokenizer, lm.chat, str(lm.path))
    return TestClient(app, base_url="http://localhost")


@pytest.fixture(scope="module")
def client(tiny):
    with _client(tiny) as c:
        yield c


def pooled(lm, ids, mode="mean") -> np.ndarray:
    """The expected embedding: numpy pooling of forward_hidden's rows of one sequence, normalised."""
    nb = -(-len(ids) // 4)
    kv = lm.model.allocate_kv(nb, 4)
    _, h = lm.model.forward_hidden(make_batch([Seq()], [ids], ShuffledBlocks(nb), 4), kv,
                                   np.arange(len(ids), dtype=np.int32))
    v = {"mean": h.astype(np.float64).mean(axis=0), "last": h[-1], "cls": h[0]}[mode]
    return normalize(v)


def test_every_input_form(client, tiny):
    tok = tiny.tokenizer
    texts = ["hello world", "abc", "a longer input that spans two engine steps"]
    ids = [tok.encode(t, add_special=True, parse_special=True) for t in texts]
    r = client.post(EMB, json={"input": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "tiny"
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"embedding"}
    n = sum(map(len, ids))
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    got = np.array([d["embedding"] for d in body["data"]])
    assert got.shape == (3, tiny.model.hparams.n_embd)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    for g, i in zip(got, ids):
        np.testing.assert_allclose(g, pooled(tiny, i), rtol=1e-4, atol=1e-5)
    # the same inputs as one string, token ids and lists of token ids
    one = client.post(EMB, json={"input": texts[0]}).json()["data"][0]["embedding"]
    assert one == body["data"][0]["embedding"]
    assert client.post(EMB, json={"input": ids[1]}).json()["data"][0]["embedding"] == body["data"][1]["embedding"]
    assert [d["embedding"] for d in client.post(EMB, json={"input": ids}).json()["data"]] == got.tolist()


def test_dimensions_and_base64(client, tiny):
    full = np.array(client.post(EMB, json={"input": "cat"}).json()["data"][0]["embedding"])
    r = client.post(EMB, json={"input": "cat", "dimensions": 8}).json()["data"][0]["embedding"]
    assert len(r) == 8 and np.linalg.norm(r) == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(r, full[:8] / np.linalg.norm(full[:8]), rtol=1e-5)
    b = client.post(EMB, json={"input": "cat", "encoding_format": "base64"}).json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(b), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(full, dtype=np.float32))


def test_many_inputs_batched_and_blocks_free(client, tiny):
    """64 inputs in one request (one admission seat, at most --max-seqs of them in the engine at
    once): all answer, the /metrics counters count them, and every KV block is free afterwards,
    none of them cached (this module's server only ever ran embeddings)."""
    texts = [f"input number {i}" for i in range(64)]
    r = client.post(EMB, json={"input": texts})
    assert r.status_code == 200 and len(r.json()["data"]) == 64
    emb = r.json()["data"]
    assert emb[5]["embedding"] == client.post(EMB, json={"input": texts[5]}).json()["data"][0]["embedding"]
    s = client.app.state.edged.models.resolve(None).engine.stats()
    assert s.running == 0 and s.waiting == 0 and s.blocks_free == s.blocks_total
    assert s.blocks_cached_free == 0
    assert client.app.state.edged.models.resolve(None).in_flight == 0
    text = client.get("/metrics").text
    assert f'edged_embedding_inputs_total{{model="tiny"}} {float(s.embedding_inputs)}' in text
    assert f'edged_embedding_tokens_total{{model="tiny"}} {float(s.embedding_tokens)}' in text
    assert s.embedding_inputs >= 65


@pytest.mark.parametrize("body,param,status", [
    ({}, "input", 400),
    ({"input": None}, "input", 400),
    ({"input": []}, "input", 400),
    ({"input": ""}, "input", 400),
    ({"input": ["a", ""]}, "input[1]", 400),
    ({"input": ["a", 3]}, "input[1]", 400),
    ({"input": [[5, 6], [10**6]]}, "input[1][0]", 400),
    ({"input": [[5, 6], []]}, "input[1]", 400),
    ({"input": 5}, "input", 400),
    ({"input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}, "input", 400),
    ({"input": ["short", "long " * 200]}, "input[1]", 400),  # past the 64-token context
    ({"input": "a", "encoding_format": "hex"}, "encoding_format", 400),
    ({"input": "a", "dimensions": 0}, "dimensions", 400),
    ({"input": "a", "dimensions": 10**6}, "dimensions", 400),
    ({"input": "a", "dimensions": "8"}, "dimensions", 400),
    ({"input": "a", "user": 3}, "user", 400),
    ({"input": "a", "model": "nope"}, None, 404),
])
def test_malformed_bodies_name_the_field(client, body, param, status):
    r = client.post(EMB, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and (param is None or err["param"] == param), err
    if param:
        assert param.split("[")[0] in err["message"]


def test_context_limit_message(client):
    err = client.post(EMB, json={"input": "long " * 200}).json()["error"]
    assert err["code"] == "context_length_exceeded" and "context holds" in err["message"]


def test_pooling_from_the_file_and_the_flag(tmp_path_factory):
    """<arch>.pooling_type 3 (last) is used; 0 (none) is a 400 unless --pooling overrides it."""
    kv = lambda v: {"gemma3.pooling_type": (v, gguf.GGUFValueType.UINT32)}  # noqa: E731
    last = _load(tmp_path_factory, "last", extra_kv=kv(3))
    ids = last.tokenizer.encode("pool me please", add_special=True, parse_special=True)
    with _client(last) as c:
        got = c.post(EMB, json={"input": ids}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(got, pooled(last, ids, "last"), rtol=1e-4, atol=1e-5)
    with _client(last, pooling="cls") as c:
        got = c.post(EMB, json={"input": ids}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(got, pooled(last, ids, "cls"), rtol=1e-4, atol=1e-5)
    none = _load(tmp_path_factory, "none", extra_kv=kv(0))
    with _client(none) as c:
        err = c.post(EMB, json={"input": "x"}).json()["error"]
        assert "pooling_type is 'none'" in err["message"] and "--pooling" in err["message"]
    with _client(none, pooling="mean") as c:
        assert c.post(EMB, json={"input": "x"}).status_code == 200
