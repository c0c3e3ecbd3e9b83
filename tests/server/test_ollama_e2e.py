"""Issue 15's acceptance for Ollama's API: the official `ollama` client's chat, generate (streamed
and not), list, ps and show against a real `edged serve` of the default model; `format` with a
JSON schema gives valid JSON; Ollama's raw generate and OpenAI's completions give the same
greedy tokens; `edged ps` prints the model. One server for the module."""

import json
import subprocess
import sys

import httpx
import jsonschema
import pytest

from tests.helpers.model import default_model_path
from tests.server.server_proc import running_server

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.e2e

MODEL = "default"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "population": {"type": "integer", "minimum": 0,
                                                                         "maximum": 10**9}},
          "required": ["city", "population"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server([str(default_model_path()), "--ctx", "1024", "--max-seqs", "4",
                         "--model-alias", MODEL, "--log-level", "warning"],
                        tmp_path_factory.mktemp("ollama-e2e") / "serve.log") as proc:
        yield proc


@pytest.fixture
def oc(server):
    return ollama.Client(host=server.url, timeout=600)


def test_list_ps_show(oc):
    assert [m.model for m in oc.list().models] == [MODEL]
    (m,) = oc.list().models
    assert m.details.family == "gemma3" and m.details.parameter_size.endswith("M")
    assert m.size == default_model_path().stat().st_size
    (p,) = oc.ps().models
    assert p.model == MODEL and p.context_length == 1024 and p.size_vram == 0
    assert p.size > m.size  # weights, KV and workspace
    info = oc.show(MODEL).modelinfo
    assert info["general.architecture"] == "gemma3" and info["gemma3.context_length"] == 32768


def test_chat_streamed_equals_whole(oc):
    msgs = [{"role": "user", "content": "Name three colours."}]
    whole = oc.chat(model=MODEL, messages=msgs, options={**GREEDY, "num_predict": 24})
    assert whole.done and whole.message.content and whole.eval_count <= 24
    parts = list(oc.chat(model=MODEL, messages=msgs, stream=True,
                         options={**GREEDY, "num_predict": 24}))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count


def test_generate_streamed_equals_whole_and_raw_equals_openai_completions(oc, server):
    whole = oc.generate(model=MODEL, prompt="Why is the sky blue?", options={**GREEDY, "num_predict": 20})
    parts = list(oc.generate(model=MODEL, prompt="Why is the sky blue?", stream=True,
                             options={**GREEDY, "num_predict": 20}))
    assert whole.response and "".join(p.response for p in parts) == whole.response
    assert parts[-1].context == whole.context
    raw = oc.generate(model=MODEL, prompt="The capital of France is", raw=True,
                      options={**GREEDY, "num_predict": 12})
    comp = httpx.post(f"{server.url}/v1/completions", timeout=600, json={
        "model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}).json()
    assert raw.response == comp["choices"][0]["text"]


def test_chat_format_schema_gives_valid_json(oc):
    r = oc.chat(model=MODEL, format=SCHEMA, options={**GREEDY, "num_predict": 64},
                messages=[{"role": "user", "content": "Give a city and its population as JSON."}])
    assert r.done_reason == "stop", r.message.content
    jsonschema.validate(json.loads(r.message.content), SCHEMA)


@pytest.mark.parametrize("fmt", ["json", SCHEMA])
def test_generate_format_gives_valid_json(oc, fmt):
    prompt = ('Q: the largest city of Italy\nA: {"city": "Rome", "population": 2750000}\n'
              "Q: the largest city of France\nA:")
    r = oc.generate(model=MODEL, prompt=prompt, raw=True, format=fmt, options={**GREEDY, "num_predict": 48})
    assert r.done_reason == "stop", r.response
    jsonschema.validate(json.loads(r.response), SCHEMA if fmt != "json" else {"type": "object"})


def test_edged_ps_prints_the_model(server):
    out = subprocess.run([sys.executable, "-c", "from edged.cli import main; main()", "ps", "--url",
                          server.url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ["NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert row.startswith(MODEL) and "100% CPU" in row and "1024" in row and row.endswith("Forever")
