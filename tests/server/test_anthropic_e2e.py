"""Issue 16's acceptance for Anthropic's Messages API: the official `anthropic` client's
messages.create and messages.stream against a real `edged serve` of the default model with an
API key (sent as x-api-key), a tool round trip (a tool_use block, then a tool_result turn
answered, with tool_choice none: the base model would only call again), count_tokens, and
errors raised as the client's typed exceptions. One server."""

import re

import jsonschema
import pytest

from tests.helpers.model import default_model_path
from tests.server.server_proc import running_server

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.e2e

MODEL = "default"
KEY = "e2e-key"
# sampling fields go in extra_body: the 2.x clients dropped temperature / top_p / top_k
GREEDY = {"temperature": 0}
ONE_CALL = {"type": "any", "disable_parallel_tool_use": True}  # else a small model calls on and on
ASK = [{"role": "user", "content": "Name three colours."}]
TOOL = {"name": "get_weather", "description": "Current weather in a city",
        "input_schema": {"type": "object", "additionalProperties": False, "required": ["city"],
                         "properties": {"city": {"type": "string", "maxLength": 12}}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server([str(default_model_path()), "--ctx", "2048", "--max-seqs", "4",
                         "--model-alias", MODEL, "--log-level", "warning"],
                        tmp_path_factory.mktemp("anthropic-e2e") / "serve.log", api_key=KEY) as proc:
        yield proc


@pytest.fixture
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=600)


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_stream_and_count_tokens(ac):
    whole = ac.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ASK,
                               system="Answer briefly.")
    assert whole.type == "message" and whole.role == "assistant" and whole.model == MODEL
    assert whole.stop_reason in ("end_turn", "max_tokens") and _text(whole)
    assert 0 < whole.usage.output_tokens <= 24
    with ac.messages.stream(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ASK,
                            system="Answer briefly.") as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == _text(final) == _text(whole)
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    count = ac.messages.count_tokens(model=MODEL, messages=ASK, system="Answer briefly.")
    assert count.input_tokens == whole.usage.input_tokens == final.usage.input_tokens


def test_stop_sequence(ac):
    text = _text(ac.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ASK))
    # a letter run past the reply's start: the base model's greedy reply may have no plain word
    word = re.findall(r"[A-Za-z]+", text)[1]
    m = ac.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ASK,
                           stop_sequences=[word])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", word)
    assert _text(m) == text[:text.index(word)]


def test_tool_round_trip(ac):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = ac.messages.create(model=MODEL, max_tokens=96, extra_body=GREEDY, messages=ask, tools=[TOOL],
                           tool_choice=ONE_CALL)
    assert m.stop_reason == "tool_use", m
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, TOOL["input_schema"])
    with ac.messages.stream(model=MODEL, max_tokens=96, extra_body=GREEDY, messages=ask, tools=[TOOL],
                            tool_choice=ONE_CALL) as stream:
        streamed = stream.get_final_message()
    (scall,) = [b for b in streamed.content if b.type == "tool_use"]
    assert (scall.name, scall.input, streamed.stop_reason) == (call.name, call.input, "tool_use")

    history = [*ask, {"role": "assistant", "content": m.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": "18 C and sunny"}]}]
    answer = ac.messages.create(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=history,
                                tools=[TOOL], tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens") and _text(answer)
    assert not [b for b in answer.content if b.type == "tool_use"]
    before = ac.messages.count_tokens(model=MODEL, messages=ask, tools=[TOOL],
                                      tool_choice={"type": "none"}).input_tokens
    assert answer.usage.input_tokens > before  # the call and its result are in the prompt


def test_errors_are_the_clients_exceptions(ac, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        ac.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 1.5}, messages=ASK)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ASK)
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, max_tokens=8, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
