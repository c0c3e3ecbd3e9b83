"""The Hermes / Qwen tool-call format end to end: a tiny random model whose GGUF carries a
Hermes-style chat template (`<tool_call>` … `</tool_call>`, `<think>` reasoning), served by
`edged serve` and driven by the `openai` client. Its weights are random, so only what the
grammar guarantees is checked: tool_choice required/named give valid calls, streamed deltas
reassemble to them, a json_schema reply validates."""

import json

import gguf
import jsonschema
import pytest

openai = pytest.importorskip("openai")

from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import running_server

pytestmark = pytest.mark.e2e

HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
You may call these tools:
<tools>
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
</tools>
Answer with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{%- for c in m.tool_calls %}
<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
<think>
{% endif %}"""
# the generation prompt opens a thinking block that only the template's `</think>` closes

TOOL = {"type": "function", "function": {
    "name": "pick", "description": "Pick a number and a colour",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["n", "colour"],
                   "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                  "colour": {"enum": ["red", "blue"]}}}}}
ASK = [{"role": "user", "content": "pick one"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("hermes")
    path = write_tiny_model(d / "hermes.gguf", "qwen2", context=2048, extra_kv={
        "tokenizer.chat_template": (HERMES_TEMPLATE + "{# </think> #}", gguf.GGUFValueType.STRING)})
    with running_server([str(path), "--ctx", "2048", "--max-seqs", "4", "--model-alias", "tiny",
                         "--log-level", "warning"], d / "serve.log") as proc:
        yield proc


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)


def _kw(**extra):
    return dict(model="tiny", messages=ASK, tools=[TOOL], max_tokens=120, temperature=0,
                parallel_tool_calls=False, extra_body={"reasoning_format": "none"}, **extra)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "pick"}}])
def test_hermes_forced_call_is_valid(client, choice):
    c = client.chat.completions.create(**_kw(tool_choice=choice)).choices[0]
    assert c.finish_reason == "tool_calls", c.message
    (call,) = c.message.tool_calls
    assert call.function.name == "pick"
    jsonschema.validate(json.loads(call.function.arguments), TOOL["function"]["parameters"])


def test_hermes_stream_reassembles(client):
    whole = client.chat.completions.create(**_kw(tool_choice="required")).choices[0].message
    args, names, finish = "", "", None
    for chunk in client.chat.completions.create(stream=True, **_kw(tool_choice="required")):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or ():
                names += tc.function.name or ""
                args += tc.function.arguments or ""
    assert finish == "tool_calls"
    assert (names, args) == (whole.tool_calls[0].function.name, whole.tool_calls[0].function.arguments)


def test_hermes_history_renders(client):
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "pick", "arguments": '{"n": 3, "colour": "red"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    c = client.chat.completions.create(**{**_kw(tool_choice="required"), "messages": history}).choices[0]
    assert c.finish_reason == "tool_calls"


def test_schema_after_reasoning(client):
    """The prompt leaves <think> open: the reply is free until </think>, then under the schema;
    a random model rarely closes it, so the whole reply is reasoning (content empty) or valid."""
    schema = TOOL["function"]["parameters"]
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=40, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "p", "schema": schema}})
    m = r.choices[0].message
    assert getattr(m, "reasoning_content", None) is not None
    if m.content:
        jsonschema.validate(json.loads(m.content), schema)
