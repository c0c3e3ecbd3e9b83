"""Structured output and tool calling through the official `openai` client against a real
`edged serve` on the default model (issue 14): 20+ schemas, 16 at once, every reply validated
with jsonschema; json_object; tool_choice required / named; streamed tool calls reassemble to the
non-streamed call; bad constraints and tools are 400s naming the field and the server keeps
serving. One server for the module, small max_tokens."""

import asyncio
import json

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from tests.helpers.model import default_model_path
from tests.server.server_proc import running_server

pytestmark = pytest.mark.e2e

S = {"type": "string", "maxLength": 12}


def obj(props: dict, required=None, **kw) -> dict:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False, **kw}


SCHEMAS = [
    obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"city": S, "temp": {"type": "number", "minimum": -50, "maximum": 60}}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"ok": {"type": "boolean"}, "count": {"type": "integer", "minimum": 1, "maximum": 9}}),
    obj({"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}),
    obj({"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                    "minItems": 2, "maxItems": 4}}),
    obj({"user": obj({"id": {"type": "integer", "minimum": 1, "maximum": 999}, "name": S})}),
    obj({"a": obj({"b": obj({"c": {"enum": ["x", "y"]}})})}),
    obj({"title": S, "note": S}, required=["title"]),
    obj({"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, S]}}),
    obj({"pet": {"anyOf": [obj({"kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 1, "maximum": 9}}),
                           obj({"kind": {"const": "dog"}, "good": {"type": "boolean"}})]}}),
    obj({"day": {"type": "string", "format": "date"}}),
    obj({"start": {"type": "string", "format": "date"}, "ip6": {"type": "string", "format": "ipv6"}}),
    obj({"id": {"type": "string", "format": "uuid"}}),
    obj({"ip": {"type": "string", "format": "ipv4"}}),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    obj({"level": {"enum": [1, 2, 3]}, "label": {"enum": ["low", "mid", "high"]}}),
    obj({"points": {"type": "array", "maxItems": 2,
                    "items": obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                  "y": {"type": "integer", "minimum": -9, "maximum": 9}})}}),
    obj({"ratio": {"type": "number", "minimum": 0, "maximum": 1}, "unit": {"const": "pct"}}),
    obj({"answer": {"type": ["string", "null"], "maxLength": 8}}),
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    obj({"first": S, "last": S, "middle": S}, required=["first", "last"]),
]
PROMPT = "Reply with a JSON value for this schema: "
MAX_TOKENS = 96
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": obj({"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
                      required=["city"])}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": obj({"a": {"type": "integer", "minimum": 0, "maximum": 999},
                           "b": {"type": "integer", "minimum": 0, "maximum": 999}})}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server([str(default_model_path()), "--ctx", "1024", "--max-seqs", "16", "--model-alias",
                         "default", "--max-batch-tokens", "256", "--log-level", "warning"],
                        tmp_path_factory.mktemp("structured") / "serve.log") as proc:
        yield proc


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=600)


def _rf(schema):
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def _validate(text: str, schema: dict):
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_schemas_16_concurrent_all_valid(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                                    timeout=600)
        async def one(i, schema):
            r = await client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": PROMPT + json.dumps(schema)}],
                response_format=_rf(schema), max_tokens=MAX_TOKENS, temperature=0.7, seed=i)
            return schema, r.choices[0]
        return await asyncio.gather(*(one(i, s) for i, s in enumerate(SCHEMAS)))

    results = asyncio.run(run())
    assert len(results) >= 20
    unfinished = [(s, c.message.content) for s, c in results if c.finish_reason != "stop"]
    assert not unfinished, unfinished
    for schema, choice in results:
        _validate(choice.message.content, schema)


def test_completions_json_schema_and_llama_server_fields(client):
    schema = SCHEMAS[0]
    r = client.completions.create(model="default", prompt="A person as JSON: ", max_tokens=MAX_TOKENS,
                                  temperature=0, extra_body={"json_schema": schema})
    _validate(r.choices[0].text, schema)
    r = client.completions.create(model="default", prompt="Pick one: ", max_tokens=8, temperature=0,
                                  extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="default", messages=ASK, max_tokens=8, temperature=0,
                                       extra_body={"structured_outputs": {"choice": ["sunny", "rain"]}})
    assert r.choices[0].message.content in ("sunny", "rain")


def test_json_object(client):
    r = client.chat.completions.create(model="default", messages=ASK, max_tokens=MAX_TOKENS,
                                       response_format={"type": "json_object"}, temperature=0)
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # the model may keep adding keys until max_tokens: still a JSON object's prefix
        assert r.choices[0].finish_reason == "length" and text.lstrip().startswith("{")


def test_length_mid_structure(client):
    r = client.chat.completions.create(model="default", messages=ASK, max_tokens=3,
                                       response_format=_rf(SCHEMAS[0]), temperature=0)
    assert r.choices[0].finish_reason == "length"


def _args_valid(call, tools=TOOLS):
    fn = next(t["function"] for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), fn["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_tool_choice_gives_valid_arguments(client, choice):
    r = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice=choice,
                                       max_tokens=MAX_TOKENS, temperature=0, parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    assert len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "add"
    _args_valid(call)


def test_streamed_tool_call_reassembles(client):
    kw = dict(model="default", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=MAX_TOKENS,
              temperature=0, parallel_tool_calls=False)
    whole = client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or ():
                c = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
                c["id"] = tc.id or c["id"]
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
    assert finish == "tool_calls"
    ref = whole.message.tool_calls
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(t.function.name, t.function.arguments) for t in ref]


def test_tool_history_and_auto(client):
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21, "sky": "clear"}'}]
    r = client.chat.completions.create(model="default", messages=history, tools=TOOLS,
                                       max_tokens=48, temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.finish_reason == "tool_calls":
        for call in c.message.tool_calls:
            _args_valid(call)
    else:
        assert isinstance(c.message.content, str)


BAD = [
    ("response_format.json_schema.schema",
     {"response_format": _rf({"type": "object", "properties": {"a": {"type": "strin"}}})}),
    ("response_format.json_schema.schema", {"response_format": _rf({"type": "object", "unevaluatedItems": 3,
                                                                    "properties": {"a": {"$ref": "#/nope"}}})}),
    ("grammar", {"grammar": "root ::= ("}),
    ("json_schema", {"json_schema": "{not json"}),
    ("tools[0].function.name", {"tools": [{"type": "function", "function": {"parameters": {}}}]}),
    ("tools[0].function.parameters", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}),
    ("tool_choice.function.name", {"tools": TOOLS, "tool_choice": {"type": "function",
                                                                    "function": {"name": "nope"}}}),
]


@pytest.mark.parametrize("field,extra", BAD, ids=[b[0] + str(i) for i, b in enumerate(BAD)])
def test_bad_inputs_are_400_naming_the_field(client, field, extra):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=ASK, max_tokens=4, extra_body=extra)
    err = e.value.body
    assert err["param"] == field and field in err["message"], err
    ok = client.chat.completions.create(model="default", messages=ASK, max_tokens=2)
    assert ok.choices[0].finish_reason == "length"
