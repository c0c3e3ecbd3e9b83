"""Ollama's /api/* in process: starlette's TestClient over the real app, engine and tokenizer of a
tiny GGUF with the stub model (no kernels): request translation, response shapes, NDJSON
streaming, options, context, raw, logprobs and errors in Ollama's {"error": ...} shape."""

import datetime
import json
from types import SimpleNamespace

import pytest

from edged.cli import ps as ps_cli
from edged.loader import load
from edged.server import ollama_generation, ollama_models, ollama_options, ollama_responses, ollama_schemas
from edged.server.errors import APIError
from edged.toolcall import ParsedMessage, ToolCall
from tests.helpers.tiny_models import write_tiny_model
from tests.server.test_app_inprocess import _client

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("ollama") / "tiny.gguf", "gemma3")
    return load(str(path), warmup=False, quiet=True)


@pytest.fixture(scope="module")
def client(tiny):
    with _client(tiny) as c:
        yield c


def _lines(client, path, body):
    """The NDJSON objects of a streamed reply (stream is Ollama's default: not sent here)."""
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"] == "application/x-ndjson"
        return [json.loads(x) for x in r.iter_lines() if x]


def _chat_prompt_ids(tiny, messages):
    return tiny.tokenizer.encode(tiny.chat.render(messages), add_special=True, parse_special=True)


def _is_timestamp(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).tzinfo is not None


# -- parsing -----------------------------------------------------------------------------------

def test_ollama_defaults_and_options_map_onto_sampling_params():
    req = ollama_schemas.parse_chat({"model": "m", "messages": HI}, 1000)
    p = req.params
    assert (p.temperature, p.top_k, p.top_p, p.repetition_penalty, p.repeat_last_n) == (0.8, 40, 0.9, 1.1, 64)
    assert req.stream is True and req.max_tokens is None and p.seed is None
    opts = {"temperature": 0.2, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 7, "num_predict": 9,
            "repeat_penalty": 1.3, "repeat_last_n": -1, "presence_penalty": 0.5,
            "frequency_penalty": 0.25, "stop": ["a", "b", "c", "d", "e", "f"], "num_ctx": 99999,
            "num_thread": 3, "mirostat": 0, "typical_p": 1.0}
    req = ollama_schemas.parse_generate({"model": "m", "prompt": "x", "options": opts, "stream": False}, 1000)
    p = req.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed) == (0.2, 5, 0.5, 0.1, 7)
    assert (p.repetition_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty) == (1.3, -1, 0.5, 0.25)
    assert p.stop == ("a", "b", "c", "d", "e", "f") and req.max_tokens == 9 and req.stream is False
    for unlimited in (-1, -2):
        assert ollama_schemas.parse_generate({"prompt": "x", "options": {"num_predict": unlimited}},
                                             1000).max_tokens is None
    assert ollama_schemas.parse_generate({"prompt": "x", "options": {"seed": -1}}, 1000).params.seed is None


def test_format_and_keep_alive_and_think_are_parsed():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = ollama_schemas.parse_chat({"messages": HI, "format": schema, "keep_alive": "1m", "think": "high"}, 100)
    assert (req.constraint.field, req.constraint.kind) == ("format", "json_schema")
    assert req.keep_alive == 60.0 and req.think is True
    req = ollama_schemas.parse_generate({"prompt": "x", "format": "json", "think": False}, 100)
    assert req.constraint.kind == "json_object" and req.think is False
    assert ollama_schemas.parse_generate({"prompt": "x", "format": ""}, 100).constraint is None


def test_history_tool_calls_and_tool_results_translate():
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18 C", "tool_name": "get_weather"}]
    req = ollama_schemas.parse_chat({"messages": msgs}, 100)
    call = req.messages[1]["tool_calls"][0]
    assert call["type"] == "function" and call["id"] == "call_1_0"
    assert call["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert req.messages[2] == {"role": "tool", "content": "18 C", "name": "get_weather"}


@pytest.mark.parametrize("body,param,words", [
    ({"options": {"temperature": 3}}, "options.temperature", "'options.temperature' must be in"),
    ({"options": {"top_k": -5}}, "options.top_k", "'options.top_k' must be >= -1"),
    ({"options": {"num_predict": 0}}, "options.num_predict", "'options.num_predict' must be >= 1"),
    ({"options": {"repeat_last_n": -2}}, "options.repeat_last_n", "'options.repeat_last_n'"),
    ({"options": {"mirostat": 2}}, "options.mirostat", "not supported"),
    ({"options": {"typical_p": 0.5}}, "options.typical_p", "not supported"),
    ({"options": {"stop": [1]}}, "options.stop", "array of strings"),
    ({"options": [1]}, "options", "'options' must be an object"),
    ({"format": "yaml"}, "format", "'format' must be"),
    ({"think": "maybe"}, "think", "'think' must be"),
    ({"keep_alive": "soon"}, "keep_alive", "not a duration"),
    ({"stream": "yes"}, "stream", "'stream' must be a boolean"),
])
def test_bad_fields_name_the_ollama_field(body, param, words):
    with pytest.raises(APIError) as e:
        ollama_schemas.parse_chat({"messages": HI, **body}, 100)
    assert e.value.status == 400 and e.value.param == param and words in e.value.message


def test_reply_tool_calls_carry_object_arguments():
    parsed = ParsedMessage("", [ToolCall("call_x", "get_weather", '{"city": "Paris", "days": 2}')],
                           reasoning_content="user wants weather")
    assert ollama_generation._message(parsed) == {
        "role": "assistant", "content": "", "thinking": "user wants weather",
        "tool_calls": [{"id": "call_x", "function": {"index": 0, "name": "get_weather",
                                                     "arguments": {"city": "Paris", "days": 2}}}]}
    with pytest.raises(ValueError, match="not a JSON object"):
        ollama_responses.tool_calls([ToolCall("c", "f", "[1]")])


def test_renamed_leaves_other_errors_alone():
    e = APIError(400, "'messages' must be", param="messages")
    assert ollama_options.renamed(e) is e


# -- chat ----------------------------------------------------------------------------------------

def test_chat_whole_reply_shape_and_counts(client, tiny):
    r = client.post("/api/chat", json={"model": "tiny", "messages": HI, "stream": False,
                                       "options": {**GREEDY, "num_predict": 6}})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["model"] == "tiny" and _is_timestamp(b["created_at"])
    assert b["message"]["role"] == "assistant" and isinstance(b["message"]["content"], str)
    assert b["done"] is True and b["done_reason"] == "length"
    assert b["eval_count"] == 6 and b["prompt_eval_count"] == len(_chat_prompt_ids(tiny, HI))
    for k in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(b[k], int) and b[k] >= 0
    assert b["total_duration"] >= b["prompt_eval_duration"] + b["eval_duration"]


def test_chat_stream_equals_whole_reply_and_openai_route(client):
    body = {"model": "tiny", "messages": HI, "options": {**GREEDY, "num_predict": 8}}
    whole = client.post("/api/chat", json={**body, "stream": False}).json()
    lines = _lines(client, "/api/chat", body)
    assert all(x["done"] is False for x in lines[:-1]) and lines[-1]["done"] is True
    assert lines[-1]["done_reason"] == "length" and lines[-1]["eval_count"] == 8
    assert lines[-1]["message"] == {"role": "assistant", "content": ""}
    streamed = "".join(x["message"]["content"] for x in lines)
    assert streamed == whole["message"]["content"]
    openai = client.post("/v1/chat/completions", json={"model": "tiny", "messages": HI,
                                                       "max_tokens": 8, "temperature": 0}).json()
    assert openai["choices"][0]["message"]["content"] == streamed


def test_chat_logprobs_one_entry_per_generated_token(client):
    b = client.post("/api/chat", json={"messages": HI, "stream": False, "logprobs": True,
                                       "top_logprobs": 2, "options": {**GREEDY, "num_predict": 4}}).json()
    assert len(b["logprobs"]) == 4
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in b["logprobs"])
    assert "".join(e["token"] for e in b["logprobs"]) == b["message"]["content"]


def test_empty_messages_load_the_model(client):
    b = client.post("/api/chat", json={"model": "tiny", "messages": []}).json()
    assert b["done"] is True and b["done_reason"] == "load"
    assert b["message"] == {"role": "assistant", "content": ""}


# -- generate ------------------------------------------------------------------------------------

def test_generate_context_continues_the_exchange(client, tiny):
    first = client.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                               "options": {**GREEDY, "num_predict": 5}}).json()
    prompt_ids = _chat_prompt_ids(tiny, HI)
    ctx = first["context"]
    assert ctx[:len(prompt_ids)] == prompt_ids and len(ctx) == len(prompt_ids) + 5
    assert tiny.tokenizer.decode(ctx[len(prompt_ids):]) == first["response"]
    second = client.post("/api/generate", json={"model": "tiny", "prompt": "more", "context": ctx,
                                                "stream": False, "options": {**GREEDY, "num_predict": 2}}).json()
    more = tiny.tokenizer.encode(tiny.chat.render([{"role": "user", "content": "more"}]),
                                 add_special=False, parse_special=True)
    assert second["prompt_eval_count"] == len(ctx) + len(more)
    assert second["context"][:len(ctx)] == ctx


def test_generate_stream_equals_whole_and_system_prompt_counts(client, tiny):
    body = {"model": "tiny", "prompt": "hi", "system": "be brief", "options": {**GREEDY, "num_predict": 7}}
    whole = client.post("/api/generate", json={**body, "stream": False}).json()
    lines = _lines(client, "/api/generate", body)
    assert "".join(x["response"] for x in lines) == whole["response"]
    assert lines[-1]["done"] is True and lines[-1]["context"] == whole["context"]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert whole["prompt_eval_count"] == len(_chat_prompt_ids(tiny, msgs))


def test_generate_raw_uses_the_prompt_as_it_is(client, tiny):
    b = client.post("/api/generate", json={"prompt": "hello there", "raw": True, "stream": False,
                                           "options": {**GREEDY, "num_predict": 3}}).json()
    assert b["prompt_eval_count"] == len(tiny.tokenizer.encode("hello there", add_special=True))
    assert "context" not in b
    comp = client.post("/v1/completions", json={"prompt": "hello there", "max_tokens": 3,
                                                "temperature": 0}).json()
    assert b["response"] == comp["choices"][0]["text"]


def test_generate_without_prompt_loads(client):
    b = client.post("/api/generate", json={"model": "tiny"}).json()
    assert b == {"model": "tiny", "created_at": b["created_at"], "response": "", "done": True,
                 "done_reason": "load"}


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,body,status,words", [
    ("/api/chat", {"model": "nope", "messages": HI}, 404, "model 'nope' not found"),
    ("/api/chat", {"messages": HI, "options": {"temperature": 9}}, 400, "options.temperature"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400, "no vision"),
    ("/api/chat", {"messages": HI, "think": True}, 400, "does not support thinking"),
    ("/api/chat", {"messages": HI, "format": "json", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, 400,
     "'format' cannot be combined with tools"),
    ("/api/chat", {"messages": HI, "format": {"type": "object", "properties": 3}}, 400, "format"),
    ("/api/chat", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, 400, "'template'"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, 400, "'suffix'"),
    ("/api/generate", {"prompt": "x", "images": ["aGk="]}, 400, "'images'"),
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, 400, "'system'"),
    ("/api/generate", {"prompt": "x", "context": [10**9]}, 400, "outside the vocabulary"),
    ("/api/generate", {"model": "tiny", "keep_alive": 0}, 400, "stays loaded"),
    ("/api/generate", [1, 2], 400, "JSON object"),
    ("/api/show", {"model": "nope"}, 404, "not found"),
])
def test_errors_are_ollamas_shape(client, path, body, status, words):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and words in r.json()["error"]


def test_bad_json_is_a_400_in_ollamas_shape(client):
    r = client.post("/api/chat", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


# -- models --------------------------------------------------------------------------------------

def test_tags_ps_show_version(client, tiny):
    tags = client.get("/api/tags").json()["models"]
    assert [m["name"] for m in tags] == ["tiny"] and tags[0]["model"] == "tiny"
    d = tags[0]["details"]
    assert d["format"] == "gguf" and d["family"] == "gemma3" and d["families"] == ["gemma3"]
    assert d["parameter_size"].endswith("K") and d["quantization_level"]
    assert tags[0]["size"] == tiny.path.stat().st_size and _is_timestamp(tags[0]["modified_at"])
    ps = client.get("/api/ps").json()["models"]
    assert [m["name"] for m in ps] == ["tiny"] and ps[0]["size_vram"] == 0
    assert ps[0]["context_length"] == 256 and ps[0]["size"] >= tags[0]["size"]
    assert ps[0]["expires_at"].startswith("2")  # pinned: far in the future
    show = client.post("/api/show", json={"model": "tiny"}).json()
    assert show["model_info"]["general.architecture"] == "gemma3"
    assert show["model_info"]["gemma3.context_length"] == 256
    assert show["model_info"]["tokenizer.ggml.tokens"] == []  # the vocabulary is left out
    assert show["template"] == tiny.chat.source and "tools" in show["capabilities"]
    assert "thinking" not in show["capabilities"] and show["details"] == d
    v = client.get("/api/version").json()
    assert v["version"].count(".") == 2 and v["edged"]


def test_device_bytes_counts_the_offloaded_layers_and_their_kv():
    host, gpu = object(), object()
    model = SimpleNamespace(host_ops=host, layer_ops=[gpu, gpu, host, host], output_ops=gpu,
                            layer_bytes=lambda i: 100 * (i + 1), output_bytes=lambda: 7)
    slot = SimpleNamespace(engine=SimpleNamespace(model=model), estimate=SimpleNamespace(kv=40))
    assert ollama_models.device_bytes(slot) == 100 + 200 + 7 + 20
    model.layer_ops, model.output_ops = [host] * 4, host
    assert ollama_models.device_bytes(slot) == 0


@pytest.mark.parametrize("n,text", [(134515008, "134.52M"), (8_030_261_248, "8.0B"), (2_000_000_000, "2B"),
                                    (268_098_176, "268.10M"), (464_000, "464K"), (12, "12")])
def test_parameter_size_as_ollama_writes_it(n, text):
    assert ollama_models.human_parameters(n) == text


def test_edged_ps_columns_read_as_ollama_ps():
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    assert [ps_cli.human_bytes(n) for n in (999, 1500, 291_000_000, 5_137_025_024, 10**12)] == [
        "999 B", "1.5 KB", "291 MB", "5.1 GB", "1 TB"]
    assert [ps_cli.processor(100, v) for v in (0, 100, 48, 120)] == [
        "100% CPU", "100% GPU", "52%/48% CPU/GPU", "Unknown"]
    at = lambda s: (now + datetime.timedelta(seconds=s)).isoformat().replace("+00:00", "Z")
    assert [ps_cli.until(at(s), now) for s in (0.5, 30, 299, 3600, 86400 * 3, -5, 300 * 365 * 86400)] == [
        "Less than a second from now", "30 seconds from now", "4 minutes from now",
        "About an hour from now", "3 days from now", "Stopping...", "Forever"]
    table = ps_cli.table([{"name": "m:latest", "size": 291_000_000, "size_vram": 0,
                           "context_length": 4096, "expires_at": at(240)}], now)
    assert table.splitlines() == ["NAME        SIZE      PROCESSOR    CONTEXT    UNTIL",
                                  "m:latest    291 MB    100% CPU     4096       4 minutes from now"]
