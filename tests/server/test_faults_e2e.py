"""Faults against a real `edged serve` of a tiny model, over raw sockets where the fault lives in
the socket: a body sent a byte a second, a client that stops reading its stream, SIGTERM with
several streams in flight (and past the drain timeout), 10,000 sequential requests (slow)."""

import json
import select
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import running_server

pytestmark = pytest.mark.e2e

TIMEOUTS = ["--body-timeout", "2", "--stream-stall-timeout", "2"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("faults") / "tiny.gguf", "gemma3", context=4096)


def _args(model, *more):
    return [str(model), "--ctx", "4096", "--max-seqs", "4", "--max-batch-tokens", "128",
            "--log-level", "warning", *more]


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    with running_server(_args(model, *TIMEOUTS), tmp_path_factory.mktemp("s") / "serve.log") as s:
        yield s


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _request_head(path: str, port: int, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _settled(server, timeout=20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["edged_kv_blocks_used"] == 0 and m["edged_requests_running"] == 0:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.2)


def test_body_a_byte_a_second_is_cut_off_at_the_body_timeout(server):
    body = json.dumps({"prompt": "Hello there", "max_tokens": 4}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(_request_head("/v1/completions", server.port, len(body)))
        t0 = time.monotonic()
        reply = b""
        for b in body:  # one byte a second until the server answers
            try:
                s.sendall(bytes([b]))
            except OSError:
                break
            if select.select([s], [], [], 1.0)[0]:
                break
        s.settimeout(5)
        try:
            while chunk := s.recv(65536):  # to EOF: the server closes the connection
                reply += chunk
        except ConnectionResetError:  # a byte sent after the server closed: RST after its 408
            pass
        took = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"body_timeout" in reply
    assert 2.0 <= took < 4.5, took


@pytest.mark.slow  # the kernel's socket buffers (up to 4 MiB) must fill first: ~1,000 steps
def test_stalled_reader_holds_bounded_memory_and_is_aborted(server):
    """4 choices of 4,000 tokens whose client never reads past the status line: the server aborts
    them (KV freed) and closes the connection within the stall timeout of the socket filling, its
    buffered deltas never past the bound, its RSS flat."""
    m0 = server.metrics()
    rss0 = rss_kib(server.proc.pid)
    # 20 top logprobs make each chunk ~2 KB: the socket buffers fill within ~500 tokens a choice
    body = json.dumps({"messages": [{"role": "user", "content": "Once"}], "max_tokens": 4000, "n": 4,
                       "ignore_eos": True, "stream": True, "temperature": 0, "logprobs": True,
                       "top_logprobs": 20}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the socket fills soon
    s.connect(("127.0.0.1", server.port))
    try:
        s.sendall(_request_head("/v1/chat/completions", server.port, len(body)) + body)
        assert s.recv(12).startswith(b"HTTP/1.1 200")
        t0, most, rss_most = time.monotonic(), 0.0, rss0
        while True:  # not reading: watch the server
            m = server.metrics()
            most = max(most, m["edged_stream_buffered_deltas"])
            rss_most = max(rss_most, rss_kib(server.proc.pid))
            if m["edged_streams_stalled_total"] > m0["edged_streams_stalled_total"]:
                break
            assert time.monotonic() - t0 < 300, (m["edged_generation_tokens_total"], most)
            time.sleep(0.2)
        m = _settled(server)
        assert m["edged_stream_buffered_deltas"] == 0
        assert most <= 4 * 512  # STREAM_BUFFER_PER_CHOICE x n
        assert (rss_most - rss0) / 1024 < 32, (rss0, rss_most)
        s.settimeout(10)
        rest = b""
        while chunk := s.recv(65536):  # what the kernel held, then EOF: the server closed it
            rest += chunk
        assert b"data: [DONE]" not in rest
    finally:
        s.close()
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200  # the server goes on


@pytest.mark.slow
def test_10000_sequential_requests_keep_rss_flat(server):
    pid, rss = server.proc.pid, []
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for i in range(10_000):
            r = c.post("/v1/completions", json={"prompt": f"Item {i % 97}", "max_tokens": 1})
            assert r.status_code == 200, r.text
            if i % 1000 == 999:
                rss.append(rss_kib(pid))
    # the first 1,000 are the warm-up; after them at most 5% growth
    assert max(rss[1:]) <= rss[0] * 1.05, rss
    _settled(server)


def _stream(url: str, body: dict, out: dict, started: threading.Event) -> None:
    text, out["finish"] = [], None
    with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                started.set()
                ch = json.loads(line[6:])["choices"][0]
                text.append(ch["text"])
                out["finish"] = ch["finish_reason"] or out["finish"]
            elif line == "data: [DONE]":
                out["done"] = True
    out["text"] = "".join(text)


def test_sigterm_with_streams_in_flight(model, tmp_path):
    """Three short streams finish whole after SIGTERM; a long one is aborted at --drain-timeout
    (its stream still ends with [DONE]); new requests get 503 or a refused connection; exit 0."""
    with running_server(_args(model, "--drain-timeout", "3"), tmp_path / "serve.log") as server:
        bodies = [{"prompt": f"Count {i}", "max_tokens": 30, "ignore_eos": True, "temperature": 0}
                  for i in range(3)]
        bodies.append({"prompt": "Long", "max_tokens": 4000, "ignore_eos": True, "temperature": 0})
        outs = [{} for _ in bodies]
        starts = [threading.Event() for _ in bodies]
        threads = [threading.Thread(target=_stream, args=(server.url, b, o, e))
                   for b, o, e in zip(bodies, outs, starts)]
        for t in threads:
            t.start()
        assert all(e.wait(120) for e in starts)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                           timeout=10)
            assert r.status_code == 503 and "retry-after" in r.headers
        except httpx.ConnectError:
            pass  # the listener already closed
        for t in threads:
            t.join(60)
        assert server.proc.wait(60) == 0
        took = time.monotonic() - t0
    for o in outs[:3]:
        assert o.get("done") and o["finish"] == "length", o
    assert outs[3].get("done") and outs[3]["finish"] == "abort", outs[3].get("finish")
    assert took < 15, took
