"""Anthropic's Messages API in process: starlette's TestClient over the real app, engine and
tokenizer of a tiny GGUF with a stub model (no kernels) that can be given a script (the tokens it
writes after a prompt of a known length), so tool calls, end_turn and thinking are reproducible:
request translation, response shapes, the event sequence, stop reasons, count_tokens, a tool
round trip, errors in Anthropic's shape naming the field, and x-api-key auth."""

import json

import gguf
import numpy as np
import pytest
from starlette.testclient import TestClient

from edged.loader import load
from edged.server import anthropic_schemas
from edged.server.anthropic_output import ContentBlocks
from edged.server.app import create_app
from edged.server.config import ServerConfig
from edged.server.errors import APIError
from edged.server.lifecycle import ServerState
from edged.toolcall import StreamDelta, ToolCallDelta
from tests.helpers.tiny_models import write_tiny_model
from tests.server.stub_model import StubModel

MSG = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
HI = [{"role": "user", "content": "hi"}]
TOOL = {"name": "get_weather", "description": "Current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                         "required": ["city"], "additionalProperties": False}}
# the generic tool format's answer (the tiny model has no template: ChatML, no tool syntax)
CALL_JSON = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")


class ScriptedModel(StubModel):
    """The stub, except that after a prompt of `script[0]` tokens it writes the token ids
    `script[1]`, then the end-of-generation token."""

    def __init__(self, vocab_size: int, eos: int):
        super().__init__(vocab_size, context_length=2048)
        self.eos = eos
        self.script: tuple[int, list[int]] | None = None

    def forward(self, batch, kv):
        logits = super().forward(batch, kv)
        if self.script is None:
            return logits
        n_prompt, ids = self.script
        for r, idx in enumerate(batch.logits_indices):
            seq = int(np.searchsorted(batch.seq_starts, idx, side="right")) - 1
            k = int(batch.seq_lens[seq]) - n_prompt  # the output token this row samples
            if 0 <= k <= len(ids):
                logits[r] = 0.0
                logits[r, ids[k] if k < len(ids) else self.eos] = 10.0
        return logits


def _app(path, model_cls=ScriptedModel, **cfg):
    tiny = load(str(path), warmup=False, quiet=True)
    state = ServerState(ServerConfig(model=str(path), ctx=2048, max_seqs=4, block_size=16, **cfg))
    app = create_app(state, load_in_background=False)
    model = model_cls(tiny.tokenizer.vocab_size, tiny.tokenizer.eos_id)
    state.attach(model, tiny.tokenizer, tiny.chat, str(path))
    return TestClient(app, base_url="http://localhost"), model, tiny


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    # no SentencePiece space prefix: a scripted text is written back exactly
    return write_tiny_model(tmp_path_factory.mktemp("anthropic") / "tiny.gguf", "gemma3", extra_kv={
        "tokenizer.ggml.add_space_prefix": (False, gguf.GGUFValueType.BOOL)})


@pytest.fixture(scope="module")
def served(tiny_path):
    client, model, tiny = _app(tiny_path)
    with client:
        yield client, model, tiny


@pytest.fixture
def client(served):
    served[1].script = None
    return served[0]


def _play(served, body: dict, text: str) -> int:
    """Make the model answer `body` with `text`; returns the prompt's token count."""
    client, model, tiny = served
    model.script = None
    n = client.post(COUNT, json={k: v for k, v in body.items() if k in (
        "model", "messages", "system", "tools", "tool_choice", "thinking")}).json()["input_tokens"]
    model.script = (n, tiny.tokenizer.encode(text, add_special=False))
    return n


def _events(client, body):
    """(event name, data) of a streamed reply."""
    with client.stream("POST", MSG, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    out = []
    for chunk in raw.split("\n\n"):
        if not chunk.strip():
            continue
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        out.append((name[7:], json.loads(data[6:])))
    for name, data in out:
        assert data["type"] == name
    return out


def _streamed_message(events) -> dict:
    """The message the events assemble into (as the anthropic client's accumulator does)."""
    msg = dict(events[0][1]["message"])
    msg["content"] = []
    args = {}
    for name, d in events[1:]:
        if name == "content_block_start":
            assert d["index"] == len(msg["content"])
            msg["content"].append(dict(d["content_block"]))
        elif name == "content_block_delta":
            block, delta = msg["content"][d["index"]], d["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                assert delta["type"] == "input_json_delta"
                args[d["index"]] = args.get(d["index"], "") + delta["partial_json"]
        elif name == "message_delta":
            msg.update(d["delta"])
            msg["usage"] = {**msg["usage"], **d["usage"]}
    for i, a in args.items():
        msg["content"][i]["input"] = json.loads(a)
    return msg


def _without_ids(msg: dict) -> dict:
    return {**{k: v for k, v in msg.items() if k != "id"},
            "content": [{k: v for k, v in b.items() if k != "id"} for b in msg["content"]]}


# -- translation ---------------------------------------------------------------------------------

def test_history_translates_to_the_chat_pipeline():
    body = {"max_tokens": 5, "system": [{"type": "text", "text": "Be brief."},
                                        {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look it up", "signature": "s"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                     "content": [{"type": "text", "text": "timeout"}]},
                    {"type": "text", "text": "And tomorrow?"}]},
                {"role": "assistant", "content": "Tomorrow it"}],
            "tools": [TOOL]}
    req = anthropic_schemas.parse_messages(body, 300)
    assert req.messages == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": "And tomorrow?"}]
    assert req.prefill == "Tomorrow it"  # the final assistant turn is continued
    assert req.tools[0]["function"] == {"name": "get_weather", "parameters": TOOL["input_schema"],
                                        "description": "Current weather in a city"}
    assert req.tool_request.choice == "auto" and req.max_tokens == 5


def test_sampling_tool_choice_and_thinking_map():
    body = {"max_tokens": 2000, "messages": HI, "temperature": 0.5, "top_p": 0.9, "top_k": 7,
            "stop_sequences": ["a", "b", "c", "d", "e"], "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    req = anthropic_schemas.parse_messages(body, 300)
    p = req.params
    assert (p.temperature, p.top_p, p.top_k) == (0.5, 0.9, 7)
    assert p.stop == req.stop_sequences == ("a", "b", "c", "d", "e")  # more than OpenAI's 4
    assert (req.tool_request.choice, req.tool_request.forced, req.tool_request.parallel) == (
        "function", "get_weather", False)
    assert req.thinking is True and req.stream is False
    any_ = anthropic_schemas.parse_messages({**body, "tool_choice": {"type": "any"},
                                            "thinking": {"type": "disabled"}}, 300)
    assert any_.tool_request.choice == "required" and any_.thinking is False
    none = anthropic_schemas.parse_messages({**body, "tool_choice": {"type": "none"}}, 300)
    assert not none.tool_request.active
    plain = anthropic_schemas.parse_messages({"max_tokens": 3, "messages": HI}, 300)
    assert plain.thinking is None and plain.params.temperature == 1.0 and plain.prefill == ""
    fmt = anthropic_schemas.parse_messages({"max_tokens": 3, "messages": HI, "output_config": {
        "format": {"type": "json_schema", "schema": TOOL["input_schema"]}}}, 300)
    assert (fmt.constraint.field, fmt.constraint.kind) == ("output_config.format.schema", "json_schema")
    # count_tokens has no max_tokens nor sampling fields: given anyway, they are ignored
    count = anthropic_schemas.parse_count_tokens({"messages": HI, "max_tokens": "x", "top_k": -9}, 300)
    assert count.max_tokens is None and count.params.top_k == 0


def test_parse_errors_carry_the_anthropic_field():
    with pytest.raises(APIError) as e:
        anthropic_schemas.parse_messages(_b(tools=[TOOL, TOOL]), 300)
    assert (e.value.status, e.value.param) == (400, "tools[1].name")
    assert e.value.message.startswith("tools[1].name: ")


# -- malformed bodies ----------------------------------------------------------------------------

def _b(**kw):
    return {"max_tokens": 4, "messages": HI, **kw}


def _user(*blocks):
    return [{"role": "user", "content": list(blocks)}]


_CALL = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}

MALFORMED = [
    ("body an array", MSG, [1], "JSON object"),
    ("max_tokens missing", MSG, {"messages": HI}, "max_tokens"),
    ("max_tokens zero", MSG, _b(max_tokens=0), "max_tokens"),
    ("max_tokens a string", MSG, _b(max_tokens="4"), "max_tokens"),
    ("messages missing", MSG, {"max_tokens": 4}, "messages"),
    ("messages empty", MSG, _b(messages=[]), "messages"),
    ("messages a string", MSG, _b(messages="hi"), "messages"),
    ("message not an object", MSG, _b(messages=[5]), "messages[0]"),
    ("system role in messages", MSG, _b(messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
    ("content missing", MSG, _b(messages=[{"role": "user"}]), "messages[0].content"),
    ("content a number", MSG, _b(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    ("block without type", MSG, _b(messages=_user({"text": "x"})), "messages[0].content[0].type"),
    ("unknown block type", MSG, _b(messages=_user({"type": "video"})), "messages[0].content[0].type"),
    ("block type an array", MSG, _b(messages=_user({"type": ["text"]})), "messages[0].content[0].type"),
    ("image block", MSG, _b(messages=_user({"type": "image", "source": {}})), "messages[0].content[0].type"),
    ("text block without text", MSG, _b(messages=_user({"type": "text"})), "messages[0].content[0].text"),
    ("tool_result without id", MSG, _b(messages=_user({"type": "tool_result", "content": "x"})),
     "messages[0].content[0].tool_use_id"),
    ("tool_result with an image", MSG, _b(messages=_user({"type": "tool_result", "tool_use_id": "t",
                                                         "content": [{"type": "image"}]})),
     "messages[0].content[0].content[0].type"),
    ("tool_result is_error a string", MSG, _b(messages=_user({"type": "tool_result", "tool_use_id": "t",
                                                             "is_error": "yes"})),
     "messages[0].content[0].is_error"),
    ("tool_use in a user turn", MSG, _b(messages=_user(_CALL)), "messages[0].content[0].type"),
    ("tool_use input a list", MSG, _b(messages=[HI[0], {"role": "assistant", "content": [
        {**_CALL, "input": [1]}]}, HI[0]]), "messages[1].content[0].input"),
    ("tool_use without name", MSG, _b(messages=[HI[0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "input": {}}]}, HI[0]]), "messages[1].content[0].name"),
    ("tool_result in an assistant turn", MSG, _b(messages=[HI[0], {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t"}]}, HI[0]]), "messages[1].content[0].type"),
    ("last turn an unanswered tool_use", MSG, _b(messages=[HI[0], {"role": "assistant", "content": [_CALL]}]),
     "messages[1]"),
    ("only an assistant turn", MSG, _b(messages=[{"role": "assistant", "content": "x"}]), "messages"),
    ("system a number", MSG, _b(system=5), "system"),
    ("system with an image", MSG, _b(system=[{"type": "image"}]), "system[0].type"),
    ("stop_sequences a string", MSG, _b(stop_sequences="x"), "stop_sequences"),
    ("stop_sequences of numbers", MSG, _b(stop_sequences=[1]), "stop_sequences[0]"),
    ("an empty stop sequence", MSG, _b(stop_sequences=[""]), "stop_sequences[0]"),
    ("seventeen stop sequences", MSG, _b(stop_sequences=[str(i) for i in range(17)]), "stop_sequences"),
    ("temperature above one", MSG, _b(temperature=1.5), "temperature"),
    ("temperature a string", MSG, _b(temperature="hot"), "temperature"),
    ("top_p zero", MSG, _b(top_p=0), "top_p"),
    ("top_k negative", MSG, _b(top_k=-1), "top_k"),
    ("top_k fractional", MSG, _b(top_k=2.5), "top_k"),
    ("stream a string", MSG, _b(stream="yes"), "stream"),
    ("tools an object", MSG, _b(tools={}), "tools"),
    ("tool without input_schema", MSG, _b(tools=[{"name": "f"}]), "tools[0].input_schema"),
    ("tool with a bad name", MSG, _b(tools=[{**TOOL, "name": "no spaces"}]), "tools[0].name"),
    ("server tool", MSG, _b(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
    ("duplicate tool names", MSG, _b(tools=[TOOL, TOOL]), "tools[1].name"),
    ("tool_choice a string", MSG, _b(tools=[TOOL], tool_choice="auto"), "tool_choice"),
    ("tool_choice OpenAI's required", MSG, _b(tools=[TOOL], tool_choice={"type": "required"}),
     "tool_choice.type"),
    ("tool_choice tool without a name", MSG, _b(tools=[TOOL], tool_choice={"type": "tool"}), "tool_choice.name"),
    ("tool_choice of an unknown tool", MSG, _b(tools=[TOOL], tool_choice={"type": "tool", "name": "nope"}),
     "tool_choice.name"),
    ("tool_choice any without tools", MSG, _b(tool_choice={"type": "any"}), "tool_choice"),
    ("disable_parallel_tool_use a string", MSG, _b(tools=[TOOL], tool_choice={
        "type": "auto", "disable_parallel_tool_use": "x"}), "tool_choice.disable_parallel_tool_use"),
    ("metadata a string", MSG, _b(metadata="x"), "metadata"),
    ("metadata.user_id a number", MSG, _b(metadata={"user_id": 5}), "metadata.user_id"),
    ("thinking a boolean", MSG, _b(thinking=True), "thinking"),
    ("thinking of an unknown type", MSG, _b(thinking={"type": "on"}), "thinking.type"),
    ("thinking without a budget", MSG, _b(thinking={"type": "enabled"}), "thinking.budget_tokens"),
    ("thinking budget under 1024", MSG, _b(thinking={"type": "enabled", "budget_tokens": 100}),
     "thinking.budget_tokens"),
    ("thinking budget over max_tokens", MSG, _b(max_tokens=1500, thinking={
        "type": "enabled", "budget_tokens": 1500}), "thinking.budget_tokens"),
    ("output format of another type", MSG, _b(output_config={"format": {"type": "text"}}),
     "output_config.format.type"),
    ("output format without a schema", MSG, _b(output_config={"format": {"type": "json_schema"}}),
     "output_config.format.schema"),
    ("output format with tools", MSG, _b(tools=[TOOL], output_config={"format": {
        "type": "json_schema", "schema": TOOL["input_schema"]}}), "output_config.format"),
    ("model a number", MSG, _b(model=5), "model"),
    ("keep_alive not a duration", MSG, _b(keep_alive="soon"), "keep_alive"),
    ("count_tokens without messages", COUNT, {"model": "tiny"}, "messages"),
    ("count_tokens with an image", COUNT, {"messages": _user({"type": "image"})}, "messages[0].content[0].type"),
]


@pytest.mark.parametrize("path,body,field", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_bodies_are_400_naming_the_field(client, path, body, field):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    b = r.json()
    assert b["type"] == "error" and set(b) == {"type", "error"}
    assert b["error"]["type"] == "invalid_request_error"
    assert field in b["error"]["message"], b["error"]["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"messages": "\xff"}'])
def test_bad_json_is_an_anthropic_400(client, raw):
    r = client.post(MSG, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_model_route_and_method(client):
    r = client.post(MSG, json=_b(model="claude-3-5-sonnet-latest"))
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert "claude-3-5-sonnet-latest" in r.json()["error"]["message"]
    r = client.get(MSG)
    assert r.status_code == 405 and r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "method GET not allowed on /v1/messages"}}
    r = client.post("/v1/messages/batches", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1}).status_code == 200


# -- replies -------------------------------------------------------------------------------------

def test_whole_message_equals_chat_completions(client):
    body = {"model": "tiny", "max_tokens": 12, "temperature": 0, "messages": HI,
            "system": "Be brief."}
    r = client.post(MSG, json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["id"].startswith("msg_") and m["type"] == "message" and m["role"] == "assistant"
    assert m["model"] == "tiny" and m["stop_reason"] == "max_tokens" and m["stop_sequence"] is None
    chat = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."}, *HI]}).json()
    (block,) = m["content"]
    assert block == {"type": "text", "text": chat["choices"][0]["message"]["content"]}
    count = client.post(COUNT, json={"model": "tiny", "messages": HI, "system": "Be brief."}).json()
    assert m["usage"] == {"input_tokens": chat["usage"]["prompt_tokens"], "output_tokens": 12}
    assert count == {"input_tokens": chat["usage"]["prompt_tokens"]}


def test_max_tokens_beyond_the_context_answers_to_its_end(client):
    max_len = client.get("/v1/models").json()["data"][0]["max_model_len"]
    r = client.post(MSG, json=_b(max_tokens=10**6, temperature=0))
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["stop_reason"] == "max_tokens"
    assert m["usage"]["input_tokens"] + m["usage"]["output_tokens"] == max_len


def test_stream_event_order_and_text(client):
    body = {"max_tokens": 10, "temperature": 0, "messages": HI}
    whole = client.post(MSG, json=body).json()
    events = _events(client, body)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": whole["usage"]["input_tokens"], "output_tokens": 0}
    assert events[2][1]["content_block"] == {"type": "text", "text": ""}
    assert events[-2][1]["usage"] == {"output_tokens": 10}
    assert _without_ids(_streamed_message(events)) == _without_ids(whole)


def test_stop_sequence_is_reported(client):
    body = {"max_tokens": 16, "temperature": 0, "messages": HI}
    text = client.post(MSG, json=body).json()["content"][0]["text"]
    stop = next(ch for ch in text[2:] if ch.isascii() and ch.isalnum())
    body["stop_sequences"] = ["\u2603never", stop]
    m = client.post(MSG, json=body).json()
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", stop)
    assert m["content"][0]["text"] == text[:text.index(stop)]
    delta = _events(client, body)[-2][1]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_end_of_generation_is_end_turn(served, client):
    body = {"max_tokens": 50, "temperature": 0, "messages": HI}
    _play(served, body, "Hello there.")
    m = client.post(MSG, json=body).json()
    assert (m["stop_reason"], m["stop_sequence"]) == ("end_turn", None)
    assert m["content"] == [{"type": "text", "text": "Hello there."}]
    assert _events(client, body)[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_prefill_is_continued(served, client):
    body = {"max_tokens": 50, "temperature": 0, "messages": [*HI, {"role": "assistant", "content": "The answer"}]}
    plain = client.post(COUNT, json={"messages": HI}).json()["input_tokens"]
    n = _play(served, body, " is 42.")
    assert n > plain  # the prefill is part of the prompt
    assert client.post(MSG, json=body).json()["content"] == [{"type": "text", "text": " is 42."}]


def test_tool_round_trip(served, client):
    ask = {"max_tokens": 200, "temperature": 0, "messages": [{"role": "user", "content": "Weather in Paris?"}],
           "tools": [TOOL], "tool_choice": {"type": "any"}}
    _play(served, ask, CALL_JSON)
    m = client.post(MSG, json=ask).json()
    assert m["stop_reason"] == "tool_use", m
    (call,) = m["content"]
    assert call["type"] == "tool_use" and call["name"] == "get_weather" and call["input"] == {"city": "Paris"}
    assert call["id"]
    events = _events(client, ask)
    assert [d["delta"]["type"] for n, d in events if n == "content_block_delta"] == [
        "input_json_delta"] * (len(events) - 6)
    assert _without_ids(_streamed_message(events)) == _without_ids(m)

    answer = {**ask, "tool_choice": {"type": "auto"}, "messages": [
        *ask["messages"], {"role": "assistant", "content": m["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "18 C"}]}]}
    n = _play(served, answer, '{"response": "It is 18 C in Paris."}')
    assert n > m["usage"]["input_tokens"]  # the call and its result are in the prompt
    r = client.post(MSG, json=answer).json()
    assert r["content"] == [{"type": "text", "text": "It is 18 C in Paris."}]
    assert r["stop_reason"] == "end_turn"


def test_call_cut_by_max_tokens_stays_text(served, client):
    ask = {"max_tokens": 20, "temperature": 0, "messages": HI, "tools": [TOOL],
           "tool_choice": {"type": "any"}}
    _play(served, ask, CALL_JSON)
    m = client.post(MSG, json=ask).json()
    assert m["stop_reason"] == "max_tokens" and [b["type"] for b in m["content"]] == ["text"]
    assert CALL_JSON.startswith(m["content"][0]["text"])


def test_blocks_open_on_a_change_of_kind_and_skip_bare_whitespace():
    blocks = ContentBlocks()
    events = []
    for p in [StreamDelta(reasoning_content="a"), StreamDelta(reasoning_content="b"),
              StreamDelta(content="\n"), StreamDelta(content=" "),
              StreamDelta(tool_call=ToolCallDelta(0, '{"x"', id="c1", name="f")),
              StreamDelta(tool_call=ToolCallDelta(0, ": 1}")),
              StreamDelta(tool_call=ToolCallDelta(1, "{}", id="c2", name="g")),
              StreamDelta(content="\n"), StreamDelta(content="done")]:
        events += blocks.add(p)
    events += blocks.close()
    assert blocks.types == ["thinking", "tool_use", "tool_use", "text"]
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts[1] == {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
    deltas = [(d["index"], d["delta"]) for n, d in events if n == "content_block_delta"]
    assert deltas == [(0, {"type": "thinking_delta", "thinking": "a"}),
                      (0, {"type": "thinking_delta", "thinking": "b"}),
                      (1, {"type": "input_json_delta", "partial_json": '{"x"'}),
                      (1, {"type": "input_json_delta", "partial_json": ": 1}"}),
                      (2, {"type": "input_json_delta", "partial_json": "{}"}),
                      (3, {"type": "text_delta", "text": "\ndone"})]
    opened_closed = [(n, d["index"]) for n, d in events if n != "content_block_delta"]
    assert opened_closed == [(n, i) for i in range(4)
                             for n in ("content_block_start", "content_block_stop")]


def test_thinking_blocks(tmp_path):
    path = write_tiny_model(tmp_path / "think.gguf", "qwen2", extra_kv={
        "tokenizer.chat_template": (THINK_TEMPLATE, gguf.GGUFValueType.STRING)})
    client, model, tiny = _app(path)
    served = (client, model, tiny)
    with client:
        body = {"max_tokens": 2000, "temperature": 0, "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": 1024}}
        _play(served, body, "sunny, say so</think>It is sunny.")
        m = client.post(MSG, json=body).json()
        assert m["content"] == [{"type": "thinking", "thinking": "sunny, say so", "signature": ""},
                                {"type": "text", "text": "It is sunny."}]
        events = _events(client, body)
        assert [d["delta"]["type"] for n, d in events if n == "content_block_delta"][0] == "thinking_delta"
        assert _without_ids(_streamed_message(events)) == _without_ids(m)
        # disabled: the template closes the thinking block itself, the reply is text
        off = {**body, "thinking": {"type": "disabled"}}
        _play(served, off, "It is sunny.")
        assert client.post(MSG, json=off).json()["content"] == [{"type": "text", "text": "It is sunny."}]


# -- transport: auth, size, engine errors --------------------------------------------------------

def test_x_api_key_and_anthropic_401(tiny_path):
    client, _, _ = _app(tiny_path, api_keys=("sekrit",))
    with client:
        r = client.post(MSG, json=_b())
        assert r.status_code == 401
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
        assert "x-api-key" in r.json()["error"]["message"]
        assert client.post(COUNT, json={"messages": HI}, headers={"x-api-key": "wrong"}).status_code == 401
        assert client.post(MSG, json=_b(), headers={"x-api-key": "sekrit",
                                                    "anthropic-version": "2099-01-01"}).status_code == 200
        assert client.post(MSG, json=_b(), headers={"authorization": "Bearer sekrit"}).status_code == 200
        r = client.get("/v1/models")  # other routes keep OpenAI's shape
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_body_over_the_limit_is_an_anthropic_413(tiny_path):
    client, _, _ = _app(tiny_path, max_body_bytes=1000)
    with client:
        r = client.post(MSG, json=_b(system="x" * 2000))
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


class _NaNModel(ScriptedModel):
    def forward(self, batch, kv):
        logits = super().forward(batch, kv)
        logits[:, 5] = float("nan")
        return logits


def test_engine_error_whole_and_streamed(tiny_path):
    client, _, _ = _app(tiny_path, model_cls=_NaNModel)
    with client:
        r = client.post(MSG, json=_b())
        assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"
        assert "not finite" in r.json()["error"]["message"]
        events = _events(client, _b())
        assert [n for n, _ in events] == ["message_start", "ping", "error"]
        assert events[-1][1]["error"]["type"] == "api_error"
