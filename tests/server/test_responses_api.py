"""The Responses API (/v1/responses) in process: starlette's TestClient over the real app, engine
and tokenizer of a tiny GGUF with the stub model (no kernels), also driven by the official openai
client through that TestClient: request translation, Response and stream-event shapes (checked
against the client's own types), errors naming the field, the store (bounds, store: false,
previous_response_id, GET / DELETE) and tool calls and reasoning through the output builder."""

import asyncio
import json

import httpx
import pytest
from pydantic import TypeAdapter

openai = pytest.importorskip("openai")
from openai.types.responses import Response, ResponseStreamEvent

from edged.engine.stream import Delta
from edged.loader import load
from edged.server import chat_tools
from edged.server.responses_api_output import OutputBuilder
from edged.server.responses_api_route import _Turn, _events
from edged.server.responses_api_schemas import parse_responses, to_messages
from edged.server.responses_api_store import ResponseStore
from tests.helpers.tiny_models import write_tiny_model
from tests.server.test_app_inprocess import _client
from tests.server.test_tools_e2e import HERMES_TEMPLATE

RESP = "/v1/responses"
GREEDY = {"model": "tiny", "temperature": 0}
EVENT = TypeAdapter(ResponseStreamEvent)
PICK = {"type": "function", "name": "pick", "description": "Pick a number and a colour",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["n", "colour"],
                       "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                      "colour": {"enum": ["red", "blue"]}}}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("responses") / "tiny.gguf", "gemma3")
    return load(str(path), warmup=False, quiet=True)


@pytest.fixture(scope="module")
def client(tiny):
    with _client(tiny) as c:
        yield c


@pytest.fixture(scope="module")
def oc(client):
    """The official client, talking to the in-process app through the TestClient."""
    return openai.OpenAI(base_url="http://localhost/v1", api_key="none", http_client=client,
                         max_retries=0)


def _parse(body, store=None):
    return parse_responses(body, 1000, store if store is not None else ResponseStore())


def _sse(client, body):
    """The typed events of a streamed reply, as (event line, data object)."""
    with client.stream("POST", RESP, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    out = []
    for block in text.strip().split("\n\n"):
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        out.append((event[7:], json.loads(data[6:])))
    return out


def _stop_after(client, text_input, n=4):
    """A stop string the stub's greedy reply to `text_input` reaches after a few tokens, so the
    reply ends 'completed' (the stub never samples the end-of-generation token by itself)."""
    r = client.post(RESP, json={**GREEDY, "input": text_input, "max_output_tokens": 12}).json()
    text = r["output"][0]["content"][0]["text"]
    for i in range(n, len(text)):
        if text[i].isalnum() and text[i] not in text[:i]:
            return text[i], text[:i]
    pytest.skip("the stub's reply has no fresh character to stop on")


# -- request translation -------------------------------------------------------------------------

def test_string_input_and_instructions_become_chat_messages():
    req = _parse({"input": "hi", "instructions": "be brief", "max_output_tokens": 7,
                  "temperature": 0.5, "top_p": 0.9})
    assert req.chat.messages == [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "hi"}]
    assert (req.chat.max_tokens, req.chat.params.temperature, req.chat.params.top_p) == (7, 0.5, 0.9)
    assert req.store is True and req.chat.n == 1 and req.chat.constraint is None
    assert req.echo["instructions"] == "be brief" and req.echo["tool_choice"] == "auto"


def test_items_become_chat_turns():
    items = [{"role": "developer", "content": [{"type": "input_text", "text": "a"},
                                               {"type": "input_text", "text": "b"}]},
             {"type": "message", "role": "user", "content": "weather?"},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "they want weather"}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "checking", "annotations": []}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]
    req = _parse({"input": items})
    assert req.chat.messages == [
        {"role": "developer", "content": "a\nb"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "checking", "reasoning_content": "they want weather",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C", "name": "get_weather"}]
    assert [i["type"] for i in req.input_items] == ["message", "message", "reasoning", "message",
                                                     "function_call", "function_call_output"]


def test_a_call_without_text_is_its_own_assistant_turn():
    msgs = to_messages([{"type": "message", "role": "user", "content": "x"},
                        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                        {"type": "function_call", "call_id": "d", "name": "f", "arguments": "{}"}], None)
    assert msgs[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "d", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def test_tools_tool_choice_and_text_format_translate():
    req = _parse({"input": "x", "tools": [PICK, {**PICK, "name": "other"}],
                  "tool_choice": {"type": "function", "name": "pick"}, "parallel_tool_calls": False})
    tr = req.chat.tool_request
    assert tr.forced == "pick" and not tr.parallel and tr.names == {"pick", "other"}
    assert req.echo["tools"][0] == {**PICK, "strict": None}
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "other"}]}
    tr = _parse({"input": "x", "tools": [PICK, {**PICK, "name": "other"}], "tool_choice": allowed}).chat.tool_request
    assert tr.choice == "required" and tr.names == {"other"}
    fmt = {"type": "json_schema", "name": "p", "schema": PICK["parameters"], "strict": True}
    req = _parse({"input": "x", "text": {"format": fmt}})
    assert (req.chat.constraint.field, req.chat.constraint.kind) == ("response_format.json_schema.schema", "json_schema")
    assert req.echo["text"] == {"format": fmt}
    assert _parse({"input": "x", "text": {"format": {"type": "json_object"}}}).chat.constraint.kind == "json_object"
    assert _parse({"input": "x", "text": {"format": {"type": "text"}}}).chat.constraint is None


def test_extensions_reach_the_sampler():
    p = _parse({"input": "x", "seed": 5, "top_k": 3, "stop": ["z"], "logit_bias": {"7": 2}}).chat.params
    assert (p.seed, p.top_k, p.stop, p.logit_bias) == (5, 3, ("z",), {7: 2.0})


# -- errors --------------------------------------------------------------------------------------

BAD = [
    ({}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": 5}, 400, "input"),
    ({"input": [5]}, 400, "input[0]"),
    ({"input": [{"content": "x"}]}, 400, "input[0]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
    ({"input": [{"role": "wizard", "content": "x"}]}, 400, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, 400, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     400, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, 400, "input[0].content[0].text"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
     400, "input[0].arguments"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, 400, "input[0].output"),
    ({"input": [{"type": "reasoning", "content": "x"}]}, 400, "input[0].content"),
    ({"input": "x", "instructions": 5}, 400, "instructions"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": "9"}, 400, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 10**9}, 400, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, 400, "temperature"),
    ({"input": "x", "top_p": 0}, 400, "top_p"),
    ({"input": "x", "stream": "yes"}, 400, "stream"),
    ({"input": "x", "store": "yes"}, 400, "store"),
    ({"input": "x", "user": 1}, 400, "user"),
    ({"input": "x", "metadata": {"k": 1}}, 400, "metadata"),
    ({"input": "x", "metadata": [1]}, 400, "metadata"),
    ({"input": "x", "tools": {}}, 400, "tools"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function"}]}, 400, "tools[0].name"),
    ({"input": "x", "tools": [{**PICK, "parameters": 3}]}, 400, "tools[0].parameters"),
    ({"input": "x", "tools": [{**PICK, "strict": "yes"}]}, 400, "tools[0].strict"),
    ({"input": "x", "tools": [PICK, PICK]}, 400, "tools[1].name"),
    ({"input": "x", "tools": [PICK], "tool_choice": "sometimes"}, 400, "tool_choice"),
    ({"input": "x", "tools": [PICK], "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice.name"),
    ({"input": "x", "tools": [PICK], "tool_choice": {"type": "file_search"}}, 400, "tool_choice.type"),
    ({"input": "x", "tools": [PICK], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                                     "tools": [{"type": "function", "name": "nope"}]}},
     400, "tool_choice.tools[0].name"),
    ({"input": "x", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "x", "tools": [PICK], "parallel_tool_calls": "no"}, 400, "parallel_tool_calls"),
    ({"input": "x", "text": 1}, 400, "text"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, 400, "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, 400, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, 400, "text.format.schema"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                        "schema": {"type": "object", "properties": 3}}}},
     400, "text.format.schema"),
    ({"input": "x", "text": {"verbosity": "loud"}}, 400, "text.verbosity"),
    ({"input": "x", "tools": [PICK], "tool_choice": "required",
      "text": {"format": {"type": "json_object"}}}, 400, "text.format"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort"),
    ({"input": "x", "reasoning": {"summary": "long"}}, 400, "reasoning.summary"),
    ({"input": "x", "background": True}, 400, "background"),
    ({"input": "x", "conversation": "conv_1"}, 400, "conversation"),
    ({"input": "x", "prompt": {"id": "p"}}, 400, "prompt"),
    ({"input": "x", "max_tool_calls": 2}, 400, "max_tool_calls"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, 400, "include[0]"),
    ({"input": "x", "include": "x"}, 400, "include"),
    ({"input": "x", "truncation": "auto"}, 400, "truncation"),
    ({"input": "x", "truncation": "maybe"}, 400, "truncation"),
    ({"input": "x", "top_logprobs": 3}, 400, "top_logprobs"),
    ({"input": "x", "stream_options": {"include_obfuscation": False}}, 400, "stream_options"),
    ({"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({"input": "x", "model": "nope"}, 404, "model"),
    ({"input": "x" * 2000}, 400, "input"),  # longer than the 256-token context
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_malformed_bodies_name_the_field(client, body, status, param):
    r = client.post(RESP, json={"model": "tiny", **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["message"]
    assert param.split("[")[0].split(".")[0] in err["message"]


def test_bodies_that_are_not_objects(client):
    for raw in (b"{nope", b"", b"[1]"):
        r = client.post(RESP, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"]


# -- whole responses -----------------------------------------------------------------------------

def test_whole_response_shape(client, tiny):
    body = {**GREEDY, "input": "hi", "max_output_tokens": 5, "metadata": {"k": "v"}, "user": "u"}
    r = client.post(RESP, json=body)
    assert r.status_code == 200, r.text
    b = r.json()
    resp = Response.model_validate(b)  # the client's own type accepts it
    assert b["id"].startswith("resp_") and b["object"] == "response" and b["model"] == "tiny"
    assert b["status"] == "incomplete" and b["incomplete_details"] == {"reason": "max_output_tokens"}
    (msg,) = b["output"]
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["status"] == "incomplete"
    assert msg["id"].startswith("msg_") and msg["content"][0]["type"] == "output_text"
    n_input = len(tiny.tokenizer.encode(tiny.chat.render([{"role": "user", "content": "hi"}]),
                                        add_special=True, parse_special=True))
    assert b["usage"] == {"input_tokens": n_input, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                          "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": n_input + 5}
    assert (b["metadata"], b["user"], b["temperature"], b["max_output_tokens"]) == ({"k": "v"}, "u", 0.0, 5)
    assert b["text"] == {"format": {"type": "text"}} and b["tools"] == [] and b["store"] is True
    assert resp.output_text == msg["content"][0]["text"]
    chat = client.post("/v1/chat/completions", json={"model": "tiny", "temperature": 0, "max_tokens": 5,
                                                     "messages": [{"role": "user", "content": "hi"}]}).json()
    assert resp.output_text == chat["choices"][0]["message"]["content"]  # the same pipeline


def test_stop_gives_completed(client):
    stop, before = _stop_after(client, "hi")
    b = client.post(RESP, json={**GREEDY, "input": "hi", "max_output_tokens": 12, "stop": [stop]}).json()
    assert b["status"] == "completed" and b["incomplete_details"] is None
    assert b["output"][0]["status"] == "completed" and b["output"][0]["content"][0]["text"] == before


def test_an_empty_reply_is_an_empty_message(client, tiny):
    b = client.post(RESP, json={**GREEDY, "input": "hi", "logit_bias": {str(tiny.tokenizer.eos_id): 100}}).json()
    assert b["status"] == "completed" and b["usage"]["output_tokens"] == 1
    assert b["output"][0]["content"][0]["text"] == ""


# -- streaming -----------------------------------------------------------------------------------

def test_stream_event_sequence(client):
    events = _sse(client, {**GREEDY, "input": "hi", "max_output_tokens": 6})
    types = [t for t, _ in events]
    assert all(t == d["type"] for t, d in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    for _, d in events:
        EVENT.validate_python(d)  # each is one of the client's event types
    deltas = [d for _, d in events if d["type"] == "response.output_text.delta"]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.incomplete"]
    created, final = events[0][1]["response"], events[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    assert final["id"] == created["id"] and final["status"] == "incomplete"
    text = "".join(d["delta"] for d in deltas)
    assert final["output"][0]["content"][0]["text"] == text
    assert events[-4][1]["text"] == text and final["usage"]["output_tokens"] == 6
    whole = client.post(RESP, json={**GREEDY, "input": "hi", "max_output_tokens": 6}).json()
    assert whole["output"][0]["content"][0]["text"] == text


def test_official_client_create_and_stream(client, oc):
    stop, before = _stop_after(client, "hello")
    kw = dict(model="tiny", input="hello", max_output_tokens=12, temperature=0, extra_body={"stop": [stop]})
    whole = oc.responses.create(**kw)
    assert whole.status == "completed" and whole.output_text == before
    with oc.responses.stream(**kw) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()  # the helper accepted the whole event sequence
    assert "".join(deltas) == final.output_text == before
    assert final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens
    assert oc.responses.retrieve(final.id).output_text == before  # streamed ones are stored too


# -- the store and previous_response_id ------------------------------------------------------------

def test_two_turns_via_previous_response_id(client, oc, tiny):
    first = oc.responses.create(model="tiny", input="hi", instructions="be brief",
                                max_output_tokens=4, temperature=0)
    second = oc.responses.create(model="tiny", input="more", previous_response_id=first.id,
                                 max_output_tokens=4, temperature=0)
    # the second prompt is the first turn (not its instructions, as OpenAI) and the new input
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "more"}]
    expect = tiny.tokenizer.encode(tiny.chat.render(history), add_special=True, parse_special=True)
    assert second.usage.input_tokens == len(expect) > first.usage.input_tokens
    assert second.previous_response_id == first.id
    third = oc.responses.create(model="tiny", input="again", previous_response_id=second.id,
                                max_output_tokens=4, temperature=0)
    history += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "again"}]
    expect = tiny.tokenizer.encode(tiny.chat.render(history), add_special=True, parse_special=True)
    assert third.usage.input_tokens == len(expect)


def test_get_delete_and_store_false(client, oc):
    r = client.post(RESP, json={**GREEDY, "input": "hi", "max_output_tokens": 3}).json()
    got = client.get(f"{RESP}/{r['id']}")
    assert got.status_code == 200 and got.json() == r
    d = client.delete(f"{RESP}/{r['id']}")
    assert d.status_code == 200 and d.json() == {"id": r["id"], "object": "response", "deleted": True}
    for method in ("GET", "DELETE"):
        e = client.request(method, f"{RESP}/{r['id']}")
        assert e.status_code == 404 and e.json()["error"]["param"] == "response_id"
    gone = client.post(RESP, json={**GREEDY, "input": "x", "previous_response_id": r["id"]})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "previous_response_id"
    unstored = oc.responses.create(model="tiny", input="hi", max_output_tokens=3, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        oc.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        oc.responses.create(model="tiny", input="x", previous_response_id=unstored.id)
    kept = client.post(RESP, json={**GREEDY, "input": "hi", "max_output_tokens": 1}).json()
    e = client.get(f"{RESP}/{kept['id']}", params={"stream": "true"})
    assert e.status_code == 400 and e.json()["error"]["param"] == "stream"


def test_store_bounds_by_count_and_age():
    now = [0.0]
    store = ResponseStore(max_responses=3, max_age_s=10, clock=lambda: now[0])
    a = store.put({"id": "a"}, [{"type": "message", "role": "user", "content": "1"}], None)
    b = store.put({"id": "b"}, [{"type": "message", "role": "user", "content": "2"}], a)
    now[0] = 5
    store.put({"id": "c"}, [], None)
    store.put({"id": "d"}, [], None)
    assert store.get("a") is None and store.get("b") is b and len(store) == 3  # the oldest went
    # an evicted parent still gives its child's conversation
    assert [i["content"] for i in b.conversation()] == ["1", "2"]
    now[0] = 10.5
    assert store.get("b") is None and store.get("c") is not None and len(store) == 2  # b aged out
    assert store.delete("c") and not store.delete("c") and len(store) == 1
    with pytest.raises(ValueError):
        ResponseStore(max_responses=0)


def test_parse_continues_the_stored_conversation():
    store = ResponseStore()
    first = store.put({"id": "resp_1"}, [
        {"type": "message", "role": "user", "content": "weather?"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "pick", "arguments": "{}",
         "status": "completed"}], None)
    req = _parse({"input": [{"type": "function_call_output", "call_id": "call_1", "output": "ok"}],
                  "previous_response_id": "resp_1", "tools": [PICK]}, store)
    assert req.previous is first and req.echo["previous_response_id"] == "resp_1"
    assert [m["role"] for m in req.chat.messages] == ["user", "assistant", "tool"]
    assert req.chat.messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "ok", "name": "pick"}


# -- tool calls and reasoning --------------------------------------------------------------------

class _FakeGeneration:
    """Replays fixed text as engine deltas, one token per piece."""

    def __init__(self, pieces, finish="stop"):
        self.pieces, self.finish = pieces, finish

    async def events(self):
        for i, p in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            yield None, Delta(token_id=i, text=p, finish_reason=self.finish if last else None,
                              num_output_tokens=i + 1)


THOUGHT_AND_CALL = ["<think>", "\nuser", " wants", " a pick", "\n</think>", "\n\n", "<tool_call>",
                    '\n{"name": "pick", ', '"arguments": {"n": 3, ', '"colour": "red"}}', "\n</tool_call>"]


def _hermes(body, pieces, finish="stop"):
    """The stream bytes of `pieces` replayed through the route's event generator, for a Hermes
    template that thinks; and the turn's store."""
    store = ResponseStore()
    req = parse_responses(body, 1000, store)
    plan = chat_tools.plan_chat(HERMES_TEMPLATE + "{# </think> #}", req.chat.tool_request, "auto")
    turn = _Turn(req, "resp_test", "tiny", 11, store)

    async def collect():
        return b"".join([e async for e in _events(_FakeGeneration(pieces, finish), turn,
                                                  OutputBuilder(plan.parser()))])

    return asyncio.run(collect()), store


def _replay_client(data: bytes):
    transport = httpx.MockTransport(lambda r: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=data))
    return openai.OpenAI(base_url="http://replay/v1", api_key="none", max_retries=0,
                         http_client=httpx.Client(transport=transport))


def test_streamed_reasoning_and_function_call_pass_the_client_helper():
    body = {"model": "tiny", "input": "pick one", "tools": [PICK], "tool_choice": "required"}
    data, store = _hermes(body, THOUGHT_AND_CALL)
    strict = {**PICK, "strict": True}  # the helper parses a strict tool's arguments
    with _replay_client(data).responses.stream(model="tiny", input="pick one", tools=[strict]) as s:
        events = list(s)
        final = s.get_final_response()
    types = [e.type for e in events]
    assert "response.reasoning_text.delta" in types and "response.function_call_arguments.delta" in types
    rs, fc = final.output
    assert rs.type == "reasoning" and rs.content[0].text == "user wants a pick"
    assert fc.type == "function_call" and fc.name == "pick" and fc.call_id.startswith("call_")
    assert json.loads(fc.arguments) == {"n": 3, "colour": "red"}
    assert fc.parsed_arguments == {"n": 3, "colour": "red"}  # the helper parsed it against the tool
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == fc.arguments
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done[0].arguments == fc.arguments
    # the reasoning tokens: up to the one closing </think>
    assert final.usage.output_tokens == len(THOUGHT_AND_CALL) and final.usage.output_tokens_details.reasoning_tokens == 5
    stored = store.get("resp_test")
    assert [i["type"] for i in stored.conversation()] == ["message", "reasoning", "function_call"]


def test_whole_and_streamed_builders_agree():
    """The non-streaming path feeds the same builder: the same items (ids aside)."""
    plan = chat_tools.plan_chat(HERMES_TEMPLATE + "{# </think> #}",
                                _parse({"input": "x", "tools": [PICK]}).chat.tool_request, "auto")
    a, b = OutputBuilder(plan.parser()), OutputBuilder(plan.parser())
    for p in THOUGHT_AND_CALL:
        a.feed(p)
    a.finish(incomplete=False)
    b.feed("".join(THOUGHT_AND_CALL), tokens=len(THOUGHT_AND_CALL))
    b.finish(incomplete=False)
    strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]
    assert strip(a.output) == strip(b.output) and len(a.output) == 2


def test_a_call_cut_short_is_incomplete_and_not_completed():
    data, store = _hermes({"model": "tiny", "input": "x", "tools": [PICK]}, THOUGHT_AND_CALL[:-2],
                          finish="length")
    with _replay_client(data).responses.stream(model="tiny", input="x") as s:
        types = [e.type for e in s]
        with pytest.raises(RuntimeError, match="response.completed"):
            s.get_final_response()
    assert types[-1] == "response.incomplete"
    last = json.loads(data.decode().strip().split("\n\n")[-1].split("\n")[1][6:])["response"]
    assert last["status"] == "incomplete" and last["output"][-1]["status"] == "incomplete"
    assert store.get("resp_test") is not None  # incomplete responses are kept to continue from


def test_engine_error_mid_stream_is_response_failed():
    data, store = _hermes({"model": "tiny", "input": "x"}, ["a", "b"], finish="error")
    last = json.loads(data.decode().strip().split("\n\n")[-1].split("\n")[1][6:])
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "server_error"
    Response.model_validate(last["response"])
    assert store.get("resp_test") is None


def test_unexpected_failure_mid_stream_is_an_error_event(monkeypatch):
    def boom(self, text, tokens=1):
        raise RuntimeError("boom")

    monkeypatch.setattr(OutputBuilder, "feed", boom)
    data, _ = _hermes({"model": "tiny", "input": "x"}, ["a"])
    last = json.loads(data.decode().strip().split("\n\n")[-1].split("\n")[1][6:])
    assert last["type"] == "error" and "internal error" in last["message"]
    EVENT.validate_python(last)
