"""Faults, in process (a stub model, no kernels): a forward pass that raises mid-batch, a KV pool
too small for the load, a client that stops reading its stream, a body sent a byte at a time.
The same faults against a real `edged serve` are in test_faults_e2e.py."""

import asyncio
import json
import time

import pytest

from edged.engine.engine import Engine, EngineConfig
from edged.engine.scheduler import AdmissionError
from edged.loader import load
from edged.sampling import SamplingParams
from edged.server import generation
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.lifecycle import ServerState
from tests.helpers.tiny_models import write_tiny_model
from tests.server.stub_model import StubModel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("faults") / "tiny.gguf", "gemma3")
    return load(str(path), warmup=False, quiet=True)


class FlakyModel(StubModel):
    """The stub, whose forward raises once, on its `fail_at`-th call (1-based)."""

    def __init__(self, vocab_size: int, fail_at: int, **kw):
        super().__init__(vocab_size, **kw)
        self.fail_at = fail_at
        self.calls = 0

    def forward(self, batch, kv):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected forward failure")
        return super().forward(batch, kv)


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def _engine(model, tok, **cfg) -> Engine:
    config = EngineConfig(**{"num_blocks": 64, "block_size": 4, "max_batch_tokens": 64,
                             "max_seqs": 2, **cfg})
    return Engine(model, tok, config).start()


def _ids(deltas):
    return [d.token_id for d in deltas if d.token_id is not None]


def _all_free(eng: Engine) -> None:
    st = eng.stats()
    assert (st.running, st.waiting, st.tokens_in_kv) == (0, 0, 0), st
    assert st.blocks_free == st.blocks_total and st.window_blocks_free == st.window_blocks_total, st


# -- a forward pass that raises mid-batch -----------------------------------------------------------

def test_forward_raising_fails_its_batch_only(tiny):
    """Two requests share the batch whose forward raises (the 3rd step): both end with the error,
    a third that waits for a seat and every later request get the stub's exact greedy tokens."""
    tok, vocab = tiny.tokenizer, tiny.tokenizer.vocab_size
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    clean = _engine(StubModel(vocab), tok)
    try:
        ref = [_ids(clean.generate(p, _greedy(6))) for p in prompts]
    finally:
        clean.stop()
    eng = _engine(FlakyModel(vocab, fail_at=3), tok)
    try:
        streams = [eng.add_request(p, _greedy(6)) for p in prompts]  # max_seqs 2: the 3rd waits
        out = [list(s) for s in streams]
        for d in (out[0], out[1]):
            assert d[-1].finish_reason == "error"
            assert d[-1].error == "RuntimeError: injected forward failure"
            assert 0 < len(_ids(d)) < 6  # failed mid-generation, after some tokens
        assert out[2][-1].finish_reason == "length" and _ids(out[2]) == ref[2]
        _all_free(eng)
        assert [_ids(eng.generate(p, _greedy(6))) for p in prompts] == ref  # later ones run clean
        _all_free(eng)
    finally:
        eng.stop()


def test_forward_raising_is_a_500_then_the_server_goes_on(tiny):
    from starlette.testclient import TestClient

    state = ServerState(ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4))
    app = create_app(state, load_in_background=False)
    slot = state.attach(FlakyModel(tiny.tokenizer.vocab_size, fail_at=2), tiny.tokenizer, tiny.chat,
                        str(tiny.path))
    body = {"prompt": "Hello", "max_tokens": 5, "temperature": 0}
    with TestClient(app, base_url="http://localhost") as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["code"] == "engine_error" and "injected forward failure" in err["message"]
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    _all_free(slot.engine)


# -- KV exhaustion -------------------------------------------------------------------------------

def test_kv_pool_too_small_preempts_and_gives_the_same_tokens(tiny):
    """Six requests that together need more blocks than the pool: the newest are preempted and
    recomputed, each ends with the tokens it gets alone, and every block comes back."""
    tok, vocab = tiny.tokenizer, tiny.tokenizer.vocab_size
    prompts = [[5 + i, 6 + i, 7 + i, 8 + i] for i in range(6)]
    big = _engine(StubModel(vocab), tok, max_seqs=6)
    small = _engine(StubModel(vocab), tok, max_seqs=6, num_blocks=12, max_batch_tokens=16)
    try:
        ref = [_ids(big.generate(p, _greedy(16))) for p in prompts]
        streams = [small.add_request(p, _greedy(16)) for p in prompts]  # 6 x 5 blocks > 12
        assert [_ids(list(s)) for s in streams] == ref
        assert small.stats().preemptions > 0
        _all_free(small)
        with pytest.raises(AdmissionError, match="exceeds the capacity of 48 tokens"):
            small.add_request([5] * 40, _greedy(16))  # could never fit: refused before queueing
    finally:
        big.stop()
        small.stop()


# -- a client that stops reading its stream ------------------------------------------------------

def _scope(path: str, body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 5000),
            "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]}


def _stalled_app(tiny, stall_timeout: float):
    state = ServerState(ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4,
                                     stream_stall_timeout=stall_timeout))
    app = create_app(state, load_in_background=False)
    slot = state.attach(StubModel(tiny.tokenizer.vocab_size, delay_s=0.002), tiny.tokenizer,
                        tiny.chat, str(tiny.path))
    return state, app, slot


async def _stalled_stream(app, state, slot, body: dict, until: float):
    """POST a stream whose client reads the status line and one chunk, then never again (every
    later send blocks, as uvicorn's does on a full socket). Returns (seconds the app took, the
    most deltas ever buffered, whether the generation was aborted before the app returned)."""
    raw = json.dumps({**body, "stream": True}).encode()
    sent = []
    blocked = asyncio.Event()  # never set: the client never reads again
    disconnect = asyncio.Event()

    async def receive():
        if not sent:
            sent.append(None)
            return {"type": "http.request", "body": raw, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)
        if msg["type"] == "http.response.body" and len(sent) > 3:
            await blocked.wait()

    most = 0
    aborted_early = False

    async def watch():
        nonlocal most, aborted_early
        while True:
            most = max(most, state.metrics.stream_buffered._value.get())
            st = slot.engine.stats()
            if st.running == 0 and st.blocks_used == 0 and len(sent) > 3:
                aborted_early = True
            await asyncio.sleep(0.005)

    t0 = time.monotonic()
    w = asyncio.ensure_future(watch())
    await asyncio.wait_for(app(_scope("/v1/completions", raw), receive, send), until)
    took = time.monotonic() - t0
    w.cancel()
    assert sent[1]["type"] == "http.response.start" and sent[1]["status"] == 200
    assert not any(m and m.get("more_body") is False for m in sent[2:])  # left incomplete: closed
    return took, most, aborted_early


def test_stalled_reader_hits_the_buffer_bound_and_is_aborted(tiny, monkeypatch):
    """A long stream nobody reads: at STREAM_BUFFER_PER_CHOICE queued deltas the generation is
    aborted (its KV freed) long before the stall timeout closes the connection."""
    monkeypatch.setattr(generation, "STREAM_BUFFER_PER_CHOICE", 16)
    state, app, slot = _stalled_app(tiny, stall_timeout=3.0)
    body = {"prompt": "Hello", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    took, most, aborted_early = asyncio.run(_stalled_stream(app, state, slot, body, until=20))
    assert most <= 16
    assert aborted_early  # freed while the send still waited
    assert 3.0 <= took < 6.0  # the connection went at the stall timeout
    assert state.metrics.stream_buffered._value.get() == 0
    assert state.metrics.streams_stalled._value.get() == 1
    _all_free(slot.engine)
    slot.engine.stop()


def test_stalled_reader_of_a_finished_stream_is_cut_at_the_stall_timeout(tiny):
    """A short stream (under the bound) that finished generating while its client does not
    read: the blocked send gives up after --stream-stall-timeout and the connection closes."""
    state, app, slot = _stalled_app(tiny, stall_timeout=1.0)
    body = {"prompt": "Hello", "max_tokens": 20, "ignore_eos": True, "temperature": 0}
    took, most, _ = asyncio.run(_stalled_stream(app, state, slot, body, until=20))
    assert 1.0 <= took < 3.0
    assert most <= 21
    assert state.metrics.streams_stalled._value.get() == 1
    assert state.metrics.stream_buffered._value.get() == 0
    _all_free(slot.engine)
    slot.engine.stop()


# -- a body sent a byte at a time ----------------------------------------------------------------

def test_body_a_byte_at_a_time_is_a_408_at_the_body_timeout(tiny):
    state = ServerState(ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4,
                                     body_timeout=1.0))
    app = create_app(state, load_in_background=False)
    slot = state.attach(StubModel(tiny.tokenizer.vocab_size), tiny.tokenizer, tiny.chat, str(tiny.path))
    raw = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
    sent, received = [], []

    async def receive():  # one byte every 0.1 s: the whole body would take several seconds
        await asyncio.sleep(0.1)
        i = len(received)
        received.append(raw[i:i + 1])
        return {"type": "http.request", "body": raw[i:i + 1], "more_body": i + 1 < len(raw)}

    async def send(msg):
        sent.append(msg)

    async def main():
        t0 = time.monotonic()
        await asyncio.wait_for(app(_scope("/v1/completions", raw), receive, send), 10)
        return time.monotonic() - t0

    took = asyncio.run(main())
    assert 1.0 <= took < 1.5
    assert len(received) < len(raw)
    start = sent[0]
    assert start["status"] == 408
    assert (b"connection", b"close") in [(k.lower(), v.lower()) for k, v in start["headers"]]
    err = json.loads(sent[1]["body"])["error"]
    assert err["code"] == "body_timeout" and "--body-timeout" in err["message"]
    slot.engine.stop()


def test_fault_timeouts_must_be_positive():
    for field in ("body_timeout", "stream_stall_timeout"):
        with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} must be > 0"):
            ServerConfig(**{field: 0}).validate()
