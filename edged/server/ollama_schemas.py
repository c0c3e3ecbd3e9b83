"""Request validation for Ollama's /api/chat and /api/generate.

An Ollama body is translated to the OpenAI shape and validated by edged.server.schemas (one set
of rules for both APIs), errors reworded to name Ollama's fields (`options.temperature`,
`format`). What edged cannot do (images, Go templates, suffix) is a 400 naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from edged.server import ollama_options, schemas
from edged.server.errors import APIError, bad_request
from edged.server.schemas import CHAT_ROLES, MAX_TOP_LOGPROBS, ChatRequest, GenerationRequest
from edged.server.spec import (AnyOf, Array, Body, Boolean, Field, Integer, Object, String, TokenId,
                               fields, type_name)
from edged.structured import Constraint, ConstraintError, schema_constraint
from edged.structured.json_grammar import json_object_grammar

THINK_LEVELS = ("high", "medium", "low")  # gpt-oss style levels: thinking on


@dataclass
class OllamaChat(ChatRequest):
    think: bool | None = None  # None: the server's --reasoning-format decides


@dataclass
class OllamaGenerate(GenerationRequest):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    context: list[int] = field(default_factory=list)  # token ids of an earlier exchange
    think: bool | None = None


# -- field definitions (the parsers read through these; /openapi.json publishes them) ----------

_NO_VISION = "this server runs text-only models (no vision)"
_MODEL = Field("model", String(), description="a model name of /api/tags; the default model when absent")
_COMMON = (
    _MODEL,
    Field("stream", Boolean(), default=True, description="NDJSON lines, the last with done: true"),
    Field("options", ollama_options.OPTIONS, description="sampling options, Ollama's defaults"),
    Field("format", AnyOf((String(enum=("", "json")), Object()), what="\"json\" or a JSON schema object"),
          description="\"json\" or a JSON schema the reply follows"),
    Field("think", AnyOf((Boolean(), String(enum=THINK_LEVELS)), what="a boolean or one of "
                         + ", ".join(THINK_LEVELS))),
    schemas.KEEP_ALIVE,
    Field("logprobs", Boolean(), default=False),
    Field("top_logprobs", Integer(0, MAX_TOP_LOGPROBS)),
)
_TOOL_CALL = Object(fields=(
    Field("id", String()),
    Field("function", Object(fields=(Field("name", String(), required=True),
                                     Field("arguments", AnyOf((Object(), String()), what="an object")))),
          required=True)))
MESSAGE = Object(fields=(
    Field("role", String(enum=CHAT_ROLES), required=True),
    Field("content", String()),
    Field("images", Array(String(), max_items=0, why=_NO_VISION)),
    Field("tool_calls", Array(_TOOL_CALL)),
    Field("tool_name", String(), description="the tool a tool message answers"),
    Field("thinking", String())))
CHAT = Body("OllamaChatRequest", fields(
    Field("messages", Array(MESSAGE), description="none (or empty): load the model; with "
          "keep_alive 0, unload it"),
    _COMMON, schemas.CHAT.field("tools")))
GENERATE = Body("OllamaGenerateRequest", fields(
    Field("prompt", String(), description="none (or \"\"): load the model; with keep_alive 0, unload it"),
    _COMMON,
    Field("system", String()),
    Field("raw", Boolean(), default=False, description="the prompt as it is, no chat template"),
    Field("context", Array(TokenId()), description="the context of an earlier reply, continued"),
    Field("images", Array(String(), max_items=0, why=_NO_VISION)),
    Field("template", String(enum=("",), why="a Go template is not supported: edged renders the "
                             "model's own chat template; send raw: true with a formatted prompt instead")),
    Field("suffix", String(enum=("",), why="fill-in-the-middle is not supported"))))
_NAMED = (_MODEL, Field("name", String(), description="older clients' model"))
SHOW = Body("OllamaShowRequest", fields(_NAMED, Field("verbose", Boolean())))
PULL = Body("OllamaPullRequest", fields(
    _NAMED, Field("stream", Boolean(), default=True), Field("insecure", Boolean())))


# -- shared ------------------------------------------------------------------------------------

def check_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type_name(body)}")
    return body


def model_name(body: dict, old_name: bool = False) -> str | None:
    """`model` (None: the server's default model, as on the OpenAI routes); with old_name, the
    `name` older clients send to /api/show and /api/pull."""
    v = (_NAMES if old_name else _MODEL_ONLY).read(body)
    return v["model"] or (v["name"] if old_name else None)


_NAMES, _MODEL_ONLY = Body("OllamaNames", _NAMED), Body("OllamaModel", (_MODEL,))


def is_empty(body: dict, spec: Body, key: str) -> bool:
    """Ollama's load/unload requests: no prompt (generate) or no messages (chat); the whole body
    is checked against `spec` first (the model's limits later, in parse_*)."""
    return not spec.read(body)[key]


def format_constraint(fmt: Any) -> Constraint | None:
    """`format` (checked by its Field): "json" (any JSON object) or a JSON schema; "" or null is none."""
    if fmt is None or fmt == "":
        return None
    try:
        if fmt == "json":
            return Constraint(json_object_grammar("format"), "format", "json_object")
        return schema_constraint(fmt, "format")
    except ConstraintError as e:
        raise bad_request(f"{e.field}: {e.message}", e.field) from None


def _think(v: dict) -> bool | None:
    """`think`: a level (high, medium, low) means on."""
    return v["think"] if v["think"] is None or isinstance(v["think"], bool) else True


def _openai_common(v: dict) -> dict:
    """The fields chat and generate share, in the OpenAI shape (stream defaults to true, as
    Ollama's). keep_alive travels as it is: the OpenAI routes take it too."""
    out = {"model": v["model"], "stream": v["stream"], **ollama_options.openai_fields(v["options"])}
    if v["keep_alive"] is not None:
        out["keep_alive"] = v["keep_alive"]
    return out


def _logprobs(v: dict) -> int | None:
    """`logprobs` / `top_logprobs` as GenerationRequest.top_logprobs."""
    return (v["top_logprobs"] or 0) if v["logprobs"] else None


def _finish(req, v: dict, constraint_allowed: bool = True):
    """Options parse_* could not take (more stop strings than OpenAI allows, repeat_last_n) and
    the `format` constraint, set on the validated request."""
    options = v["options"]
    stop = ollama_options.stop_strings(options)
    changes = {"repeat_last_n": ollama_options.repeat_last_n(options)}
    if stop is not None:
        changes["stop"] = stop
    try:
        req.params = dataclasses.replace(req.params, **changes)
    except ValueError as e:
        raise bad_request(str(e), "options") from None
    constraint = format_constraint(v["format"])
    if constraint is not None and not constraint_allowed:
        raise bad_request("'format' cannot be combined with tools", "format")
    req.constraint = constraint
    return req


def _fields(req) -> dict:
    return {f.name: getattr(req, f.name) for f in dataclasses.fields(req)}


def _renamed(fn, *args):
    try:
        return fn(*args)
    except APIError as e:
        raise ollama_options.renamed(e) from None


# -- /api/chat -----------------------------------------------------------------------------------

def _message(m: dict, i: int) -> dict:
    """One Ollama message (checked by MESSAGE) in the OpenAI shape: tool calls get ids and a
    JSON-text-or-object `arguments` (the chat templates take either); a tool result keeps its
    tool_name as `name`."""
    out = {k: m[k] for k in ("role", "content") if k in m}
    calls = m.get("tool_calls")
    if calls is not None:
        out["tool_calls"] = [_tool_call(c, i, k) for k, c in enumerate(calls)]
    if m.get("tool_name") is not None:
        out["name"] = m["tool_name"]
    return out


def _tool_call(c: dict, i: int, k: int) -> dict:
    fn = c["function"]
    call_id = c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{k}"
    return {"id": call_id, "type": "function",
            "function": {"name": fn.get("name"), "arguments": fn.get("arguments", {})}}


def parse_chat(body: Any, vocab_size: int) -> OllamaChat:
    """Validate an /api/chat body with non-empty messages."""
    v = CHAT.read(body, vocab_size=vocab_size)
    if not v["messages"]:
        raise bad_request("'messages' must be a non-empty array of messages", "messages")
    oa = {**_openai_common(v), "messages": [_message(m, i) for i, m in enumerate(v["messages"])]}
    if v["tools"]:
        oa["tools"] = v["tools"]
    top = _logprobs(v)
    if top is not None:
        oa.update(logprobs=True, top_logprobs=top)
    req = _renamed(schemas.parse_chat, oa, vocab_size)
    req = OllamaChat(**_fields(req), think=_think(v))
    return _finish(req, v, constraint_allowed=not req.tool_request.active)


# -- /api/generate -------------------------------------------------------------------------------

def parse_generate(body: Any, vocab_size: int) -> OllamaGenerate:
    """Validate an /api/generate body with a non-empty prompt."""
    v = GENERATE.read(body, vocab_size=vocab_size)
    if not v["prompt"]:
        raise bad_request("'prompt' must be a non-empty string", "prompt")
    raw, system = v["raw"], v["system"] or None
    if raw and system:
        raise bad_request("'system' cannot be combined with raw: true (the prompt is used as it "
                          "is)", "system")
    common = _renamed(schemas.parse_generation, _openai_common(v), vocab_size)
    req = OllamaGenerate(**common, top_logprobs=_logprobs(v), prompt=v["prompt"], system=system,
                         raw=raw, context=list(v["context"] or []), think=_think(v))
    return _finish(req, v)
