"""Several models in one server, in process: tiny real models imported into a temporary store,
loaded on demand through edged.loader (no warm-up), evicted, expired and unloaded."""

import asyncio
import re
import shutil
import threading
import time

import pytest
from starlette.testclient import TestClient

from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.errors import APIError
from edged.server.keep_alive import FOREVER, parse_keep_alive
from edged.server.lifecycle import ServerState
from edged.server.metrics import ServerMetrics
from edged.server.model_manager import ModelManager
from edged.server.model_memory import parse_max_memory, total_memory
from edged.server.model_slot import ModelSlot
from edged.store import ModelStore
from tests.helpers.tiny_models import write_tiny_model

COMP = "/v1/completions"
A, B, C = "tiny-llama:latest", "tiny-qwen:latest", "tiny-phi:latest"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("mm")
    st = ModelStore(d / "store")
    for name, arch in ((A, "llama"), (B, "qwen2"), (C, "phi3")):
        st.import_path(write_tiny_model(d / f"{arch}.gguf", arch), name=name)
    return st


def _config(**kw):
    return ServerConfig(ctx=128, max_seqs=2, block_size=4, warmup=False, **kw)


@pytest.fixture
def serve(store):
    """serve(**config) -> a TestClient over `edged serve` (no MODEL) of the store."""
    clients = []

    def start(**kw):
        state = ServerState(_config(**kw), store=store)
        c = TestClient(create_app(state), base_url="http://localhost").__enter__()
        clients.append(c)
        _wait(lambda: state.status == "ready")
        return c

    yield start
    for c in clients:
        c.__exit__(None, None, None)


def _wait(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _status(client) -> dict:
    return {m["id"]: m["status"] for m in client.get("/v1/models").json()["data"]}


def _complete(client, model, **kw):
    r = client.post(COMP, json={"model": model, "prompt": "a b c", "max_tokens": 4,
                                "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _slot(client, model):
    return client.app.state.edged.models.resolve(model)


def _metric(client, name, **labels) -> float:
    """The sum of `name`'s samples carrying these labels."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


# -- units ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,seconds", [
    ("5m", 300), ("1h30m", 5400), ("30s", 30), ("1.5h", 5400), ("500ms", 0.5), ("300", 300),
    (0, 0), ("0", 0), (120, 120), (2.5, 2.5), (-1, FOREVER), ("-1", FOREVER), ("-5m", FOREVER)])
def test_keep_alive_values(text, seconds):
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "m", "", "1h30", True, None, [], "nan"])
def test_keep_alive_rejects(bad):
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(bad)


def test_max_memory_values():
    assert parse_max_memory(None) is None and parse_max_memory("0") is None
    assert parse_max_memory("8GiB") == 8 * 2**30 and parse_max_memory("512MB") == 512 * 10**6
    assert parse_max_memory("0.5") == total_memory() // 2
    with pytest.raises(ValueError):
        parse_max_memory("lots")


# -- serving the store ------------------------------------------------------------------------

def test_models_load_on_demand_and_keep_their_own_tokens(serve):
    c = serve()
    assert c.get("/health").json() == {"status": "ok"}  # ready before any model loads
    assert _status(c) == {A: "unloaded", B: "unloaded", C: "unloaded"}
    alone = {m: _complete(c, m) for m in (A, B)}
    assert alone[A] != alone[B]
    cards = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert cards[A]["status"] == cards[B]["status"] == "loaded" and cards[A]["max_model_len"] == 128
    assert "max_model_len" not in cards[C]
    for _ in range(2):  # alternating: each model keeps its own greedy output
        for m in (A, B):
            assert _complete(c, m) == alone[m]
    assert _complete(c, "tiny-llama") == alone[A]  # "name" means name:latest
    assert _complete(c, "TINY-QWEN:latest") == alone[B]  # store names ignore case
    assert c.get("/v1/models/tiny-qwen").json()["status"] == "loaded"
    assert _metric(c, "edged_model_loads_total", model=A, outcome="ok") == 1
    assert _metric(c, "edged_generation_tokens_total", model=B) > 0
    assert "edged_models_loaded 2.0" in c.get("/metrics").text


def test_unknown_model_is_404_listing_the_available(serve):
    c = serve()
    r = c.post(COMP, json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["param"] == "model" and err["code"] == "model_not_found"
    assert all(m in err["message"] for m in (A, B, C))
    assert c.get("/v1/models/nope").status_code == 404
    r = c.post(COMP, json={"prompt": "x"})  # no default chat model in this store, none loaded
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    _complete(c, A)
    assert c.post(COMP, json={"prompt": "x", "max_tokens": 1}).json()["model"] == A  # the loaded one
    r = c.post("/tokenize", json={"model": B, "content": "a b"})
    assert r.status_code == 200 and r.json()["tokens"]


def test_max_loaded_models_evicts_the_least_recently_used(serve):
    c = serve(max_loaded_models=2)
    _complete(c, A)
    _complete(c, B)
    _complete(c, A)  # B is now the least recently used
    _complete(c, C)
    assert _status(c) == {A: "loaded", B: "unloaded", C: "loaded"}
    assert _metric(c, "edged_model_unloads_total", model=B, reason="evicted") == 1
    assert _slot(c, B).engine is None and _slot(c, B).tokenizer is None


def test_one_loaded_model_evicts_the_idle_one_but_not_a_busy_one(serve):
    c = serve(max_loaded_models=1)
    _complete(c, A)
    _complete(c, B)
    assert _status(c)[A] == "unloaded"
    models = c.app.state.edged.models
    hold = models.hold(_slot(c, B))  # a request still using B
    try:
        r = c.post(COMP, json={"model": A, "prompt": "x"})
        assert r.status_code == 503 and r.headers["retry-after"]
        msg = r.json()["error"]["message"]
        assert "--max-loaded-models 1" in msg and f"{B} (1 request)" in msg
    finally:
        models.release(hold)
    _complete(c, A)
    assert _status(c) == {A: "loaded", B: "unloaded", C: "unloaded"}


def test_max_memory_503_names_the_numbers(serve, store):
    one = _estimate(store, A)
    c = serve(max_memory=str(one + one // 2), max_loaded_models=0)  # room for one model
    _complete(c, A)
    models = c.app.state.edged.models
    hold = models.hold(_slot(c, A))
    try:
        r = c.post(COMP, json={"model": B, "prompt": "x"})
        assert r.status_code == 503
        msg = r.json()["error"]["message"]
        assert "--max-memory" in msg and "weights" in msg and "KV" in msg and f"{A} (1 request)" in msg
    finally:
        models.release(hold)
    _complete(c, B)  # A idle now: evicted for B
    assert _status(c)[A] == "unloaded"
    c2 = serve(max_memory="1MiB")
    r = c2.post(COMP, json={"model": A, "prompt": "x"})
    assert r.status_code == 503 and "more than --max-memory 1.0 MiB" in r.json()["error"]["message"]
    assert _metric(c2, "edged_model_loads_total", model=A, outcome="no_room") == 1


def _estimate(store, name, **kw):
    from edged.server.model_memory import estimate_file
    from edged.server.model_slot import ModelSlot

    slot = ModelSlot(_config(**kw), None, path=str(store.resolve(name)), name=name)
    est = estimate_file(slot.model_path, slot.plan_kv, slot.config)
    assert est.weights == store.get(name).size and est.kv > 0 and est.workspace > 0
    return est if kw else est.total


def test_kv_type_sizes_the_estimate_and_the_served_cache(serve, store):
    """--kv-type (default f16) is the type the estimate counts and the loaded engine allocates."""
    f16, f32 = _estimate(store, A, kv_type="f16"), _estimate(store, A, kv_type="f32")
    assert 2 * f16.kv == f32.kv
    c = serve()
    _complete(c, A)
    assert _metric(c, "edged_kv_type", model=A, kv_type="f16") == 1
    assert _metric(c, "edged_kv_bytes_total", model=A) == f16.kv
    c32 = serve(kv_type="f32")
    _complete(c32, A)
    assert _metric(c32, "edged_kv_bytes_total", model=A) == f32.kv
    with pytest.raises(ValueError, match="--kv-type must be one of"):
        _config(kv_type="q4").validate()


def test_keep_alive_zero_unloads_after_the_request(serve):
    c = serve()
    _complete(c, A, keep_alive=0)
    _wait(lambda: _status(c)[A] == "unloaded", 10)
    assert _metric(c, "edged_model_unloads_total", model=A, reason="expired") == 1
    r = c.post(COMP, json={"model": A, "prompt": "x", "keep_alive": "soon"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"


def test_keep_alive_expiry_and_forever(serve):
    c = serve(keep_alive=0.3)
    _complete(c, A)
    _complete(c, B, keep_alive=-1)
    _wait(lambda: _status(c)[A] == "unloaded", 10)
    time.sleep(0.5)
    assert _status(c)[B] == "loaded"
    _complete(c, B, keep_alive="200ms")  # the last request's keep_alive counts
    _wait(lambda: _status(c)[B] == "unloaded", 10)


def test_load_timeout_503_then_the_load_finishes(serve, monkeypatch):
    real = ModelSlot.load

    def slow_load(slot):  # a tiny model can load before the request starts waiting: make it slow
        time.sleep(0.5)
        return real(slot)

    monkeypatch.setattr(ModelSlot, "load", slow_load)
    c = serve(load_timeout=0.05)
    r = c.post(COMP, json={"model": A, "prompt": "x"})
    assert r.status_code == 503 and "--load-timeout" in r.json()["error"]["message"]
    _wait(lambda: _status(c)[A] == "loaded")  # the load went on without the request
    _complete(c, A)


def test_preload_loads_at_start(serve):
    c = serve(preload=(B,))
    _wait(lambda: _status(c)[B] == "loaded")
    assert _status(c)[A] == "unloaded"


def test_model_given_is_pinned_and_the_store_not_listed(store):
    state = ServerState(_config(model=B), store=store)
    with TestClient(create_app(state), base_url="http://localhost") as c:
        _wait(lambda: state.status == "ready")
        assert _status(c) == {B: "loaded"}  # its store id; the other entries are not served
        _complete(c, "tiny-qwen", keep_alive=0)
        assert c.post(COMP, json={"model": A, "prompt": "x"}).status_code == 404
        time.sleep(0.2)
        assert _status(c) == {B: "loaded"}  # pinned: keep_alive does not unload it


def test_empty_store_serves_the_default_model(tmp_path):
    from tests.helpers.model import default_model_path

    path = default_model_path()
    state = ServerState(_config(), store=ModelStore(tmp_path / "empty"))
    state.load()
    assert state.status == "ready", state.error
    assert [s.model_name for s in state.models.listed()] == [path.stem]
    assert state.models.resolve(None).pinned
    state.shutdown()


def test_drain_waits_for_every_model(serve):
    c = serve()
    _complete(c, A)
    _complete(c, B)
    state = c.app.state.edged
    a, b = _slot(c, A), _slot(c, B)
    a.acquire(1)
    b.acquire(1)
    state.begin_drain()
    assert c.post(COMP, json={"model": A, "prompt": "x"}).status_code == 503
    assert not state.drain_done()
    a.release(1)
    assert not state.drain_done()
    b.release(1)
    assert state.drain_done()


# -- the manager alone ------------------------------------------------------------------------

def _manager(**kw) -> ModelManager:
    config = _config(**kw)
    return ModelManager(config, ServerMetrics(lambda: []))


def test_requests_for_one_model_share_one_load(store):
    mm = _manager()
    slot = mm.add(mm.new_slot(path=str(store.resolve(A)), name=A))

    async def both():
        await asyncio.gather(mm.ready(slot), mm.ready(slot), mm.ready(slot))

    asyncio.run(both())
    assert slot.status == "loaded" and slot.engine is not None
    assert mm.metrics.model_loads.labels(A, "ok")._value.get() == 1
    _wait(lambda: "edged-load" not in {t.name for t in threading.enumerate()})  # the load thread left
    mm.shutdown()


def test_failed_load_is_500_and_the_next_request_retries(store, tmp_path):
    mm = _manager()
    path = tmp_path / "later.gguf"
    slot = mm.add(mm.new_slot(path=str(path), name="later"))
    with pytest.raises(APIError) as e:
        asyncio.run(mm.ready(slot))
    assert e.value.status == 500 and "later" in e.value.message and "later.gguf" in e.value.message
    assert slot.status == "unloaded" and slot.error
    shutil.copy(store.resolve(A), path)
    asyncio.run(mm.ready(slot))
    assert slot.status == "loaded" and slot.error is None
    assert mm.metrics.model_loads.labels("later", "failed")._value.get() == 1
    mm.shutdown()


def test_every_model_forwards_on_the_one_compute_thread(store):
    """One OpenMP team for all models: both engines' forward passes run on edged-compute."""
    from edged.loader import load
    from edged.sampling import SamplingParams
    from edged.server.compute_thread import ComputeThread
    from tests.server.stub_model import StubModel

    class Recording(StubModel):
        threads: set = set()

        def forward(self, batch, kv):
            self.threads.add(threading.current_thread().name)
            return super().forward(batch, kv)

    state = ServerState(_config())
    slots = []
    for name in (A, B):
        lm = load(str(store.resolve(name)), warmup=False, quiet=True)
        slots.append(state.attach(Recording(lm.tokenizer.vocab_size), lm.tokenizer, lm.chat, str(lm.path)))
    for s in slots:
        assert len(s.engine.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=3))) >= 3
    assert Recording.threads == {"edged-compute"}
    state.shutdown()

    def boom():
        raise ValueError("kernel failed")

    ct = ComputeThread("edged-compute-test")
    with pytest.raises(ValueError, match="kernel failed"):
        ct.run(boom)
    assert ct.run(lambda x: x + 1, 1) == 2  # the thread survives a failed job
