"""Issue 16's acceptance for the Responses API: the official openai client against a real
`edged serve`. On the default model: responses.create (the same greedy tokens as chat
completions), responses.stream (the client's helper accepts the event sequence; the deltas make
the final text), text.format json_schema, a two-turn conversation via previous_response_id (the
same prompt as the conversation sent whole), retrieve / delete / store: false, and a malformed
body naming its field. On a tiny Hermes-template model: a forced function call, whole and
streamed, and its result sent back via previous_response_id."""

import json

import gguf
import jsonschema
import pytest

openai = pytest.importorskip("openai")

from tests.helpers.model import default_model_path
from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import running_server
from tests.server.test_tools_e2e import HERMES_TEMPLATE, TOOL

pytestmark = pytest.mark.e2e

MODEL = "default"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": False}
PICK = {"type": "function", "name": "pick", "description": TOOL["function"]["description"],
        "parameters": TOOL["function"]["parameters"], "strict": True}


@pytest.fixture(scope="module")
def oc(tmp_path_factory):
    with running_server([str(default_model_path()), "--ctx", "1024", "--max-seqs", "4",
                         "--model-alias", MODEL, "--log-level", "warning"],
                        tmp_path_factory.mktemp("responses-e2e") / "serve.log") as proc:
        yield openai.OpenAI(base_url=f"{proc.url}/v1", api_key="none", max_retries=0, timeout=600)


def test_create_equals_chat_completions(oc):
    ask = "Name three colours."
    r = oc.responses.create(model=MODEL, input=ask, max_output_tokens=20, temperature=0)
    chat = oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ask}],
                                      max_tokens=20, temperature=0)
    assert r.output_text and r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")


def test_stream_with_the_client_helper_and_a_schema(oc):
    kw = dict(model=MODEL, input="Give a city in France as JSON.", max_output_tokens=64, temperature=0,
              text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    with oc.responses.stream(**kw) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()  # raises unless the sequence ended in response.completed
    assert final.status == "completed" and "".join(deltas) == final.output_text
    jsonschema.validate(json.loads(final.output_text), CITY)
    assert oc.responses.create(**kw).output_text == final.output_text


def test_plain_stream_deltas_make_the_text(oc):
    events = list(oc.responses.create(model=MODEL, input="Why is the sky blue?",
                                      max_output_tokens=16, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text


def test_two_turns_via_previous_response_id(oc):
    first = oc.responses.create(model=MODEL, input="My name is Ada. Say hello.",
                                max_output_tokens=12, temperature=0)
    second = oc.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                 max_output_tokens=12, temperature=0)
    assert second.usage.input_tokens > first.usage.input_tokens + 5
    # the stored turn is what a client sending the whole conversation would send
    whole = oc.responses.create(model=MODEL, max_output_tokens=12, temperature=0, input=[
        {"role": "user", "content": "My name is Ada. Say hello."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert whole.usage.input_tokens == second.usage.input_tokens
    assert whole.output_text == second.output_text


def test_retrieve_delete_and_store_false(oc):
    r = oc.responses.create(model=MODEL, input="Hi", max_output_tokens=4, temperature=0)
    assert oc.responses.retrieve(r.id).output_text == r.output_text
    oc.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oc.responses.retrieve(r.id)
    unstored = oc.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        oc.responses.create(model=MODEL, input="And?", previous_response_id=unstored.id)


def test_malformed_body_names_the_field(oc):
    with pytest.raises(openai.BadRequestError) as e:
        oc.responses.create(model=MODEL, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}])
    assert e.value.body["param"] == "input[0].content[0].type"
    with pytest.raises(openai.BadRequestError) as e:
        oc.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0].type"


# -- function calls on a tiny Hermes-template model ----------------------------------------------

@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses-hermes")
    path = write_tiny_model(d / "hermes.gguf", "qwen2", context=2048, extra_kv={
        "tokenizer.chat_template": (HERMES_TEMPLATE + "{# </think> #}", gguf.GGUFValueType.STRING)})
    # --reasoning-format none: the tools' grammar from the first token (a random model seldom
    # closes the <think> the template opens)
    with running_server([str(path), "--ctx", "2048", "--max-seqs", "2", "--model-alias", "tiny",
                         "--reasoning-format", "none", "--log-level", "warning"], d / "serve.log") as proc:
        yield openai.OpenAI(base_url=f"{proc.url}/v1", api_key="none", max_retries=0, timeout=300)


def test_forced_call_whole_streamed_and_continued(hermes):
    kw = dict(model="tiny", input="pick one", tools=[PICK], tool_choice="required",
              parallel_tool_calls=False, max_output_tokens=160, temperature=0)
    r = hermes.responses.create(**kw)
    assert r.status == "completed", r.output
    calls = [i for i in r.output if i.type == "function_call"]
    assert [c.name for c in calls] == ["pick"] and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), PICK["parameters"])
    with hermes.responses.stream(**kw) as s:
        args = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
        final = s.get_final_response()
    (call,) = [i for i in final.output if i.type == "function_call"]
    assert args == call.arguments == calls[0].arguments
    assert call.parsed_arguments == json.loads(call.arguments)
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "picked"}
    nxt = hermes.responses.create(model="tiny", previous_response_id=r.id, tools=[PICK],
                                  max_output_tokens=8, temperature=0, input=[result])
    assert nxt.usage.input_tokens > r.usage.input_tokens
    whole = hermes.responses.create(model="tiny", tools=[PICK], max_output_tokens=8, temperature=0,
                                    input=[{"role": "user", "content": "pick one"},
                                           {"type": "function_call", "call_id": calls[0].call_id,
                                            "name": "pick", "arguments": calls[0].arguments}, result])
    assert whole.usage.input_tokens == nxt.usage.input_tokens
