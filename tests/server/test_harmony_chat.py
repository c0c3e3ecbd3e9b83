"""A harmony reply through /v1/chat/completions: the tiny gpt-oss file's tokenizer (its CONTROL
harmony tokens rendered as llama.cpp does, <|return|>/<|call|> ending generation) and its
gpt-oss-style template, the real engine and app, and a stub that replays a scripted reply token by
token. The reply becomes reasoning_content, content and tool_calls, streamed and not; under
tool_choice auto the call is also generated through the harmony tools grammar (lazy trigger). And a
history turn's reasoning_content reaches the template as `thinking`."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from starlette.testclient import TestClient

from edged.chat import ChatTemplate
from edged.loader import load
from edged.server.app import create_app
from edged.server.chat_tools import constraint_options, note_prompt, plan_chat, render_prompt
from edged.structured import schema_constraint
from edged.toolcall import parse_tool_request
from edged.server.config import ServerConfig
from edged.server.lifecycle import ServerState
from tests.helpers.harmony_template import HARMONY_CHAT_TEMPLATE
from tests.helpers.tiny_models import write_tiny_model
from tests.toolcall.streamcheck import WEATHER

CHAT = "/v1/chat/completions"
CTX = 2048
THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
ANSWER = "<|start|>assistant<|channel|>final<|message|>It is sunny."
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'


class ScriptedModel:
    """Emits `script` (token ids) after whatever prompt it is given, then `end`."""

    def __init__(self, vocab_size: int):
        self.vocab_size, self.context_length = vocab_size, CTX
        self.script, self.prompt_len = [], 0

    def kv_bytes_per_token(self) -> int:
        return 64

    def kv_host_bytes(self, num_blocks: int, block_size: int = 16) -> int:
        return 0

    def allocate_kv(self, num_blocks: int, block_size: int = 16):
        return []

    def forward(self, batch, kv) -> np.ndarray:
        if batch.n_tokens > 1 or int(batch.positions[0]) == 0:  # a prefill: the prompt's length
            self.prompt_len = int(batch.seq_lens[0])
        logits = np.zeros((len(batch.logits_indices), self.vocab_size), dtype=np.float32)
        for r, row in enumerate(batch.logits_indices):
            g = int(batch.positions[row]) + 1 - self.prompt_len  # index of the token to emit
            logits[r, self.script[min(g, len(self.script) - 1)]] = 10.0
        return logits


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # the byte-level vocabulary makes the system header and the tools hundreds of tokens
    path = write_tiny_model(tmp_path_factory.mktemp("go") / "go.gguf", "gpt-oss", context=CTX)
    loaded = load(str(path), warmup=False, quiet=True)
    state = ServerState(ServerConfig(model=str(loaded.path), ctx=CTX, max_seqs=2, block_size=16))
    app = create_app(state, load_in_background=False)
    model = ScriptedModel(loaded.tokenizer.vocab_size)
    state.attach(model, loaded.tokenizer, loaded.chat, str(loaded.path))
    with TestClient(app, base_url="http://localhost") as client:
        yield client, model, loaded.tokenizer


def _script(served, text: str, end: str) -> None:
    _, model, tok = served
    model.script = tok.encode(text, add_special=False) + [tok.vocab.token_to_id[end]]


def _stream(client, body) -> tuple[dict, str]:
    """The streamed deltas reassembled, and the finish reason."""
    got = {"content": "", "reasoning_content": "", "calls": []}
    finish = None
    with client.stream("POST", CHAT, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            finish = choice.get("finish_reason") or finish
            d = choice["delta"]
            for key in ("content", "reasoning_content"):
                got[key] += d.get(key) or ""
            for tc in d.get("tool_calls") or []:
                if tc["index"] == len(got["calls"]):
                    got["calls"].append({"name": tc["function"]["name"], "arguments": ""})
                got["calls"][tc["index"]]["arguments"] += tc["function"]["arguments"]
    return got, finish


def test_tokenizer_keeps_the_markers(served):
    _, _, tok = served
    ids = tok.encode(THINK + ANSWER, add_special=False)
    assert tok.decode(ids) == THINK + ANSWER  # the markers are rendered text, one token each
    assert {tok.vocab.tokens[i] for i in tok.eos_ids} >= {"<|return|>", "<|call|>"}
    assert tok.vocab.token_to_id["<|end|>"] not in tok.eos_ids


def test_reasoning_and_answer(served):
    client = served[0]
    _script(served, THINK + ANSWER, "<|return|>")
    body = {"model": "go", "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 60, "temperature": 0}
    msg = client.post(CHAT, json=body).json()["choices"][0]
    assert msg["message"]["content"] == "It is sunny." and msg["finish_reason"] == "stop"
    assert msg["message"]["reasoning_content"] == "The user wants the weather."
    got, finish = _stream(client, body)
    assert (got["content"], got["reasoning_content"], finish) == ("It is sunny.", "The user wants the weather.", "stop")


def test_tool_call_under_the_lazy_grammar(served):
    client = served[0]
    _script(served, THINK + CALL, "<|call|>")
    body = {"model": "go", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 200,
            "temperature": 0, "tools": [WEATHER]}
    choice = client.post(CHAT, json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert choice["message"]["reasoning_content"] == "The user wants the weather."
    got, finish = _stream(client, body)
    assert finish == "tool_calls" and [c["name"] for c in got["calls"]] == ["get_weather"]
    assert json.loads(got["calls"][0]["arguments"]) == {"city": "Paris"}


def test_the_grammar_holds_the_arguments_to_the_schema(served):
    """A reply whose arguments break the schema is steered by the grammar once it triggered."""
    client = served[0]
    _script(served, THINK + CALL.replace('"city"', '"town"'), "<|call|>")
    body = {"model": "go", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 200,
            "temperature": 0, "tools": [WEATHER]}
    message = client.post(CHAT, json=body).json()["choices"][0]["message"]
    [call] = message["tool_calls"]
    assert "town" not in call["function"]["arguments"]
    assert set(json.loads(call["function"]["arguments"])) <= {"city", "unit"}


def test_history_reasoning_reaches_the_template_as_thinking():
    """OpenAI clients send a turn's reasoning back as reasoning_content; gpt-oss's template
    renders the analysis before a pending tool call from `thinking`."""
    chat = ChatTemplate(HARMONY_CHAT_TEMPLATE, "gguf")
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    text = render_prompt(chat, plan_chat(HARMONY_CHAT_TEMPLATE, None, "auto"), history, [WEATHER])
    assert ("<|start|>assistant<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant "
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>') in text


def test_constraint_phases_for_harmony():
    """Tools: the lazy call grammar waits for its trigger only (a call may come before any final
    answer); a response_format: free until the final channel's header, then the schema."""
    grammars = SimpleNamespace(token_ref=lambda text: None, trigger=lambda text, at_start: (text, at_start))
    tools = plan_chat(HARMONY_CHAT_TEMPLATE, parse_tool_request([WEATHER], "auto"), "auto")
    note_prompt(tools, "<|start|>user<|message|>Hi<|end|><|start|>assistant")
    constraint, opts = constraint_options(tools, grammars, None)
    assert constraint is not None and opts == {"triggers": [("to=functions.", False)]}
    answer = plan_chat(HARMONY_CHAT_TEMPLATE, None, "auto")
    note_prompt(answer, "<|start|>user<|message|>Hi<|end|><|start|>assistant")
    _, opts = constraint_options(answer, grammars, schema_constraint({"type": "object"}, "response_format"))
    assert opts["start_after"] == "<|channel|>final<|message|>" and opts["starts_in_reasoning"]
