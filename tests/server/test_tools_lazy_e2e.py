"""tool_choice "auto" with a lazy grammar, end to end: a tiny Hermes-template model whose vocabulary
has `<tool_call>` as one user-defined token (as Qwen 2.5's). A logit bias makes the random model
emit that trigger; from there the call is generated under the tool's grammar, so it is valid.
Without the bias the model writes free text, returned as content."""

import json

import gguf
import jsonschema
import pytest

openai = pytest.importorskip("openai")

from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import running_server
from tests.server.test_tools_e2e import ASK, HERMES_TEMPLATE, TOOL

pytestmark = pytest.mark.e2e

VOCAB = 320
TRIGGER_ID = VOCAB - 3 - 2  # the first of the two added tokens (tiny_models puts them last)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("hermes_lazy")
    path = write_tiny_model(d / "hermes.gguf", "qwen2", context=2048, vocab=VOCAB,
                            added_tokens=("<tool_call>", "</tool_call>"), extra_kv={
                                "tokenizer.chat_template": (HERMES_TEMPLATE, gguf.GGUFValueType.STRING)})
    with running_server([str(path), "--ctx", "2048", "--max-seqs", "2", "--model-alias", "tiny",
                         "--log-level", "warning"], d / "serve.log") as proc:
        yield openai.OpenAI(base_url=f"{proc.url}/v1", api_key="none", max_retries=0, timeout=300)


def _ask(client, **extra):
    # 400 tokens: a random model takes the longest whitespace the JSON grammar allows between tokens
    return client.chat.completions.create(
        model="tiny", messages=ASK, tools=[TOOL], tool_choice="auto", max_tokens=400, temperature=0,
        parallel_tool_calls=False, extra_body={"reasoning_format": "none", **extra}).choices[0]


def test_trigger_turns_the_grammar_on(client):
    c = _ask(client, logit_bias={str(TRIGGER_ID): 100})
    assert c.finish_reason == "tool_calls", c.message
    (call,) = c.message.tool_calls
    assert call.function.name == "pick"
    jsonschema.validate(json.loads(call.function.arguments), TOOL["function"]["parameters"])


def test_no_trigger_is_content(client):
    c = _ask(client, logit_bias={str(TRIGGER_ID): -100})
    assert not c.message.tool_calls
    assert c.finish_reason in ("stop", "length") and c.message.content is not None
