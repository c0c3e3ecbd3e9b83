"""Request validation for Anthropic's POST /v1/messages and /v1/messages/count_tokens.

The bodies are declared as spec Bodies (edged.server.spec: the one definition validates and gives
the JSON Schema), so every error names the field as the client wrote it (`messages[1].content[0].type`,
`stop_sequences`, `tools[0].input_schema`). A validated body is translated to the OpenAI chat shape
and read by schemas.parse_chat (one set of rules for every API), whose few errors of its own are
renamed back to Anthropic's fields. Content edged cannot use (images, documents, server tools) is a
400 saying so.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from edged.server import schemas
from edged.server.errors import APIError, bad_request
from edged.server.schemas import KEEP_ALIVE, MODEL, ChatRequest
from edged.server.spec import (VOCAB, Anything, AnyOf, Array, Body, Boolean, Field, Integer, Node,
                               Number, Object, String, fields, type_name)
from edged.structured import ConstraintError, schema_constraint

MAX_STOP_SEQUENCES = 16  # SamplingParams' limit
MAX_STOP_CHARS = 256
MIN_THINKING_BUDGET = 1024  # Anthropic's lower bound for thinking.budget_tokens


@dataclass
class AnthropicRequest(ChatRequest):
    prefill: str = ""  # a final assistant turn's text: the reply continues it
    stop_sequences: tuple[str, ...] = ()
    thinking: bool | None = None  # None: the server's --reasoning-format decides


@dataclass
class Tagged(Node):
    """An object whose `type` member picks its shape (content blocks, tool_choice, thinking);
    a type in `refused` is a 400 saying why edged does not take it."""

    kinds: dict = field(default_factory=dict)  # type -> Object (declaring its own `type`)
    refused: dict = field(default_factory=dict)  # type -> why it is not supported
    description: str = ""

    def takes(self, v):
        return isinstance(v, dict)

    def check(self, v, path, ctx):
        if not isinstance(v, dict):
            raise bad_request(f"'{path}' must be an object, got {type_name(v)}", path)
        kind = v.get("type")
        if isinstance(kind, str) and kind in self.refused:
            raise bad_request(f"'{path}.type' {kind!r} is not supported: {self.refused[kind]}",
                              f"{path}.type")
        if not isinstance(kind, str) or kind not in self.kinds:
            shown = repr(kind[:40]) if isinstance(kind, str) else type_name(kind)
            raise bad_request(f"'{path}.type' must be one of {', '.join(map(repr, self.kinds))}, "
                              f"got {shown}", f"{path}.type")
        return self.kinds[kind].check(v, path, ctx)

    def json_schema(self):
        # anyOf (the `type` consts make the branches disjoint), so an optional field adds null
        return {"anyOf": [o.schema() for o in self.kinds.values()],
                "discriminator": {"propertyName": "type"}}


def _kind(name: str, *members: Field, description: str = "") -> Object:
    return Object(fields=(Field("type", String(enum=(name,)), required=True), *members),
                  description=description)


# -- declarations (validation and the OpenAPI document both come from these) -----------------------

_CACHE = Field("cache_control", Anything(("object",)), description="accepted, unused (edged's "
               "prefix cache is automatic)")
TEXT = _kind("text", Field("text", String(), required=True), _CACHE,
             Field("citations", Anything(("array",)), description="accepted, unused"))
_NOT_TEXT = {"image": "this server runs text-only models",
             "document": "documents are not supported (send their text)",
             "search_result": "search results are not supported",
             "container_upload": "containers are not supported"}
TEXT_BLOCK = Tagged({"text": TEXT}, _NOT_TEXT)
TOOL_RESULT = _kind(
    "tool_result", Field("tool_use_id", String(min_len=1), required=True),
    Field("content", AnyOf((String(), Array(TEXT_BLOCK)), what="a string or an array of text blocks")),
    Field("is_error", Boolean(), default=False, description="the text reaches the model as 'Error: ...'"),
    _CACHE)
TOOL_USE = _kind("tool_use", Field("id", String(min_len=1), required=True),
                 Field("name", String(min_len=1), required=True),
                 Field("input", Anything(("object",)), required=True), _CACHE)
THINKING = _kind("thinking", Field("thinking", String()), Field("signature", String()),
                 description="an earlier turn's thinking: not shown to the model again")
REDACTED_THINKING = _kind("redacted_thinking", Field("data", String()))
BLOCK = Tagged({"text": TEXT, "tool_use": TOOL_USE, "tool_result": TOOL_RESULT,
                "thinking": THINKING, "redacted_thinking": REDACTED_THINKING},
               {**_NOT_TEXT, "server_tool_use": "server tools are not supported",
                "web_search_tool_result": "server tools are not supported"})
MESSAGE = Object(fields=(
    Field("role", String(enum=("user", "assistant"), why="the system prompt is the top-level "
                         "'system'"), required=True),
    Field("content", AnyOf((String(), Array(BLOCK)), what="a string or an array of content blocks"),
          required=True)))

TOOL = Object(fields=(  # `type` first: a server tool is refused as one, not for its missing schema
    Field("type", String(enum=("custom",), why="server tools are not supported")),
    Field("name", String(pattern=r"[A-Za-z0-9_.\-]{1,64}", why="1-64 of a-z, A-Z, 0-9, '_', '-', '.'"),
          required=True),
    Field("description", String()),
    Field("input_schema", Anything(("object",)), required=True, description="a JSON Schema of an object"),
    _CACHE))
_NO_PARALLEL = Field("disable_parallel_tool_use", Boolean(), default=False)
TOOL_CHOICE = Tagged({"auto": _kind("auto", _NO_PARALLEL), "any": _kind("any", _NO_PARALLEL),
                      "tool": _kind("tool", Field("name", String(min_len=1), required=True), _NO_PARALLEL),
                      "none": _kind("none")})
THINKING_CONFIG = Tagged({
    "enabled": _kind("enabled", Field("budget_tokens", Integer(lo=MIN_THINKING_BUDGET), required=True,
                                      description="less than max_tokens; not enforced apart")),
    "adaptive": _kind("adaptive"), "disabled": _kind("disabled")},
    description="enabled / adaptive: a thinking template's reasoning comes back as thinking blocks")
OUTPUT_CONFIG = Object(fields=(
    Field("format", _kind("json_schema", Field("schema", Anything(("object",)), required=True))),
    Field("effort", String(), description="accepted, unused")))

PROMPT = (  # what both routes render
    MODEL,
    Field("messages", Array(MESSAGE, min_items=1), required=True),
    Field("system", AnyOf((String(), Array(TEXT_BLOCK)), what="a string or an array of text blocks")),
    Field("tools", Array(TOOL)),
    Field("tool_choice", TOOL_CHOICE),
    Field("thinking", THINKING_CONFIG),
    Field("output_config", OUTPUT_CONFIG),
)
MESSAGES = Body("AnthropicMessagesRequest", fields(
    PROMPT,
    Field("max_tokens", Integer(lo=1), required=True, description="at most the context left after "
          "the prompt"),
    Field("stop_sequences", Array(String(min_len=1, max_len=MAX_STOP_CHARS), max_items=MAX_STOP_SEQUENCES)),
    Field("temperature", Number(0.0, 1.0), description="0 is greedy"),
    Field("top_p", Number(0.0, 1.0, lo_open=True)),
    Field("top_k", Integer(0, VOCAB), description="0: off"),
    Field("stream", Boolean(), default=False, description="Anthropic's event stream"),
    Field("metadata", Object(fields=(Field("user_id", String()),)), description="accepted, unused"),
    KEEP_ALIVE,
))
COUNT_TOKENS = Body("AnthropicCountTokensRequest", fields(PROMPT))


# -- translation to the OpenAI chat shape ---------------------------------------------------------

def _text(content) -> str:
    """A string or validated text blocks as one string, as llama.cpp flattens them."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] for b in content)


def _blocks(content) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _user(content, where: str) -> list[dict]:
    """One user turn: its tool_result blocks become tool messages, its text user messages, in
    the order they come."""
    out: list[dict] = []
    texts: list[str] = []
    for j, b in enumerate(_blocks(content)):
        if b["type"] == "text":
            texts.append(b["text"])
            continue
        if b["type"] != "tool_result":
            raise bad_request(f"'{where}.content[{j}].type' {b['type']!r} belongs in an assistant "
                              "turn", f"{where}.content[{j}].type")
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        text = _text(b.get("content"))
        out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                    "content": f"Error: {text}" if b.get("is_error") else text})
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content, where: str) -> dict:
    """One assistant turn: text and tool calls; earlier turns' thinking is not shown again (as
    Anthropic drops it from the context)."""
    texts, calls = [], []
    for j, b in enumerate(_blocks(content)):
        if b["type"] == "text":
            texts.append(b["text"])
        elif b["type"] == "tool_use":
            calls.append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        elif b["type"] == "tool_result":
            raise bad_request(f"'{where}.content[{j}].type' 'tool_result' belongs in a user turn",
                              f"{where}.content[{j}].type")
    msg: dict = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _messages(v: dict) -> tuple[list[dict], str]:
    """The OpenAI messages (system first) and the prefill text of a final assistant turn."""
    out: list[dict] = []
    if v["system"] is not None:
        out.append({"role": "system", "content": _text(v["system"])})
    prefill, last = "", len(v["messages"]) - 1
    for i, m in enumerate(v["messages"]):
        where = f"messages[{i}]"
        if m["role"] == "user":
            out += _user(m["content"], where)
            continue
        msg = _assistant(m["content"], where)
        if i == last:
            if msg.get("tool_calls"):
                raise bad_request(f"'{where}' is an assistant turn with tool_use: answer it with a "
                                  "user turn of tool_result blocks", f"{where}.content")
            prefill = msg["content"] or ""
            continue
        out.append(msg)
    if all(m["role"] == "system" for m in out):
        raise bad_request("'messages' must hold a user turn", "messages")
    return out, prefill


def _tool_fields(v: dict) -> dict:
    """tools / tool_choice as the OpenAI fields tools, tool_choice and parallel_tool_calls."""
    out: dict = {}
    if v["tools"]:
        out["tools"] = [{"type": "function", "function": {
            "name": t["name"], "parameters": t["input_schema"],
            **({"description": t["description"]} if t.get("description") is not None else {})}}
            for t in v["tools"]]
    tc = v["tool_choice"]
    if tc is None:
        return out
    kind = tc["type"]
    if kind in ("any", "tool") and not v["tools"]:
        raise bad_request(f"'tool_choice' {kind!r} needs a non-empty 'tools'", "tool_choice")
    out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    if tc.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


def _anthropic_field(param: str) -> str:
    """An OpenAI field parse_chat named -> the Anthropic field it came from."""
    if param.startswith("tools[") and ".function" in param:
        head, _, rest = param.partition(".function")
        return head + (".input_schema" if rest == ".parameters" else rest)
    return {"tool_choice.function.name": "tool_choice.name",
            "parallel_tool_calls": "tool_choice.disable_parallel_tool_use"}.get(param, param)


def _renamed(e: APIError) -> APIError:
    name = _anthropic_field(e.param) if e.param else None
    if name is None or name == e.param:
        return e
    return bad_request(e.message.replace(e.param, name), name, e.code)


def _thinking(v: dict) -> bool | None:
    """enabled / adaptive -> True, disabled -> False; the budget is checked as Anthropic does but
    not enforced apart (max_tokens bounds thinking and answer together)."""
    t = v["thinking"]
    if t is None:
        return None
    if t["type"] == "enabled" and v.get("max_tokens") is not None and t["budget_tokens"] >= v["max_tokens"]:
        raise bad_request(f"'thinking.budget_tokens' ({t['budget_tokens']}) must be less than "
                          f"'max_tokens' ({v['max_tokens']})", "thinking.budget_tokens")
    return t["type"] != "disabled"


def _output_format(v: dict):
    """output_config.format as a constraint (its schema compiled: a bad one is a 400 naming it)."""
    fmt = (v["output_config"] or {}).get("format")
    if fmt is None:
        return None
    try:
        return schema_constraint(fmt["schema"], "output_config.format.schema")
    except ConstraintError as e:
        raise bad_request(f"{e.field}: {e.message}", e.field) from None


def _parse(spec: Body, body: Any, vocab_size: int) -> AnthropicRequest:
    v = spec.read(body, vocab_size=vocab_size)
    v.setdefault("max_tokens", None)
    messages, prefill = _messages(v)
    oa: dict = {"model": v["model"], "messages": messages, **_tool_fields(v)}
    for name in ("max_tokens", "stream", "temperature", "top_p", "top_k"):
        if v.get(name) is not None:
            oa[name] = v[name]
    if isinstance(body, dict) and body.get("keep_alive") is not None:  # read again by parse_chat
        oa["keep_alive"] = body["keep_alive"]
    try:
        req = schemas.parse_chat(oa, vocab_size)
    except APIError as e:
        raise _renamed(e) from None
    stops = tuple(v.get("stop_sequences") or ())
    req = AnthropicRequest(**{f.name: getattr(req, f.name) for f in dataclasses.fields(req)},
                           prefill=prefill, stop_sequences=stops, thinking=_thinking(v))
    req.params = dataclasses.replace(req.params, stop=stops)
    req.constraint = _output_format(v)
    if req.constraint is not None and req.tool_request.active:
        raise bad_request("'output_config.format' cannot be combined with tools (unless "
                          "tool_choice is 'none')", "output_config.format")
    return req


def parse_messages(body: Any, vocab_size: int) -> AnthropicRequest:
    """Validate a /v1/messages body."""
    return _parse(MESSAGES, body, vocab_size)


def parse_count_tokens(body: Any, vocab_size: int) -> AnthropicRequest:
    """Validate a /v1/messages/count_tokens body (no max_tokens, sampling or stream)."""
    return _parse(COUNT_TOKENS, body, vocab_size)
