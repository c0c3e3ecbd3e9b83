"""Issue 15's first acceptance line: after ./install.sh, `edged serve` (no MODEL) serves the store's
default chat model, and the openai client's greedy "What is 2 + 2?" is answered with 4, ended by
the model's end-of-turn token before max_tokens."""

import pytest
from openai import OpenAI

from edged.store import ModelStore
from tests.helpers.model import SMOLLM2, smollm2_path
from tests.server.server_proc import running_server

pytestmark = pytest.mark.e2e

MAX_TOKENS = 64


@pytest.fixture()
def installed_store(tmp_path, monkeypatch):
    """A store as ./install.sh leaves it: the default chat model only."""
    root = tmp_path / "store"
    ModelStore(root).import_path(smollm2_path(), name=SMOLLM2)
    monkeypatch.setenv("EDGED_MODELS", str(root))
    return root


def test_default_chat_model_answers_two_plus_two(installed_store, tmp_path):
    with running_server(["--ctx", "1024", "--max-seqs", "2"], tmp_path / "serve.log") as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        listed = [m.id for m in client.models.list().data]
        assert listed == [SMOLLM2]
        reply = client.chat.completions.create(
            model="smollm2-135m-instruct", temperature=0, max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": "What is 2 + 2?"}])
    choice = reply.choices[0]
    assert "4" in choice.message.content, choice.message.content
    # "stop" without stop strings: the model's end-of-turn token (<|im_end|>) ended the reply
    assert choice.finish_reason == "stop"
    assert reply.usage.completion_tokens < MAX_TOKENS
