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
from edged.server.schemas import ChatRequest, GenerationRequest, _bool, _int, _opt, _MISSING, _str, _type_name
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


# -- shared ------------------------------------------------------------------------------------

def check_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_type_name(body)}")
    return body


def model_name(body: dict, old_name: bool = False) -> str | None:
    """`model` (None: the server's default model, as on the OpenAI routes); with old_name, the
    `name` older clients send to /api/show and /api/pull."""
    return _str(body, "model") or (_str(body, "name") if old_name else None)


def is_empty(body: dict, key: str) -> bool:
    """Ollama's load/unload requests: no prompt (generate) or no messages (chat)."""
    v = body.get(key)
    return v is None or v == "" or v == []


def format_constraint(fmt: Any) -> Constraint | None:
    """`format`: "json" (any JSON object) or a JSON schema; "" or null is none."""
    if fmt is None or fmt == "":
        return None
    try:
        if fmt == "json":
            return Constraint(json_object_grammar("format"), "format", "json_object")
        if isinstance(fmt, dict):
            return schema_constraint(fmt, "format")
    except ConstraintError as e:
        raise bad_request(f"{e.field}: {e.message}", e.field) from None
    raise bad_request("'format' must be \"json\" or a JSON schema object", "format")


def _think(body: dict) -> bool | None:
    v = _opt(body, "think")
    if v is _MISSING:
        return None
    if isinstance(v, bool):
        return v
    if v in THINK_LEVELS:
        return True
    raise bad_request(f"'think' must be a boolean or one of {', '.join(THINK_LEVELS)}", "think")


def _openai_common(body: dict) -> dict:
    """The fields chat and generate share, in the OpenAI shape (stream defaults to true, as
    Ollama's). keep_alive travels as it is: the OpenAI routes take it too."""
    out = {"model": model_name(body), "stream": _bool(body, "stream", default=True),
           **ollama_options.openai_fields(body.get("options"))}
    if body.get("keep_alive") is not None:
        out["keep_alive"] = body["keep_alive"]
    return out


def _logprobs(body: dict) -> int | None:
    """`logprobs` / `top_logprobs` as GenerationRequest.top_logprobs."""
    if not _bool(body, "logprobs"):
        return None
    return _int(body, "top_logprobs", lo=0, hi=schemas.MAX_TOP_LOGPROBS, default=0)


def _finish(req, body: dict, constraint_allowed: bool = True):
    """Options parse_* could not take (more stop strings than OpenAI allows, repeat_last_n) and
    the `format` constraint, set on the validated request."""
    options = body.get("options")
    stop = ollama_options.stop_strings(options)
    changes = {"repeat_last_n": ollama_options.repeat_last_n(options)}
    if stop is not None:
        changes["stop"] = stop
    try:
        req.params = dataclasses.replace(req.params, **changes)
    except ValueError as e:
        raise bad_request(str(e), "options") from None
    constraint = format_constraint(body.get("format"))
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

def _message(m: Any, i: int) -> dict:
    """One Ollama message in the OpenAI shape: tool calls get ids and a JSON-text-or-object
    `arguments` (the chat templates take either); a tool result keeps its tool_name as `name`."""
    if not isinstance(m, dict):
        raise bad_request(f"messages[{i}] must be an object", "messages")
    if m.get("images"):
        raise bad_request(f"messages[{i}].images: this server runs text-only models (no vision)",
                          "messages")
    out = {k: m[k] for k in ("role", "content") if k in m}
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad_request(f"messages[{i}].tool_calls must be an array", "messages")
        out["tool_calls"] = [_tool_call(c, i, k) for k, c in enumerate(calls)]
    if m.get("tool_name") is not None:
        out["name"] = m["tool_name"]
    return out


def _tool_call(c: Any, i: int, k: int) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict):
        raise bad_request(f"messages[{i}].tool_calls[{k}].function must be an object", "messages")
    call_id = c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{k}"
    return {"id": call_id, "type": "function",
            "function": {"name": fn.get("name"), "arguments": fn.get("arguments", {})}}


def parse_chat(body: Any, vocab_size: int) -> OllamaChat:
    """Validate an /api/chat body with non-empty messages."""
    check_object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array of messages", "messages")
    oa = {**_openai_common(body), "messages": [_message(m, i) for i, m in enumerate(messages)]}
    tools = body.get("tools")
    if tools not in (None, []):
        oa["tools"] = tools
    top = _logprobs(body)
    if top is not None:
        oa.update(logprobs=True, top_logprobs=top)
    req = _renamed(schemas.parse_chat, oa, vocab_size)
    req = OllamaChat(**_fields(req), think=_think(body))
    return _finish(req, body, constraint_allowed=not req.tool_request.active)


# -- /api/generate -------------------------------------------------------------------------------

def parse_generate(body: Any, vocab_size: int) -> OllamaGenerate:
    """Validate an /api/generate body with a non-empty prompt."""
    check_object(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("'prompt' must be a non-empty string", "prompt")
    if body.get("images"):
        raise bad_request("'images': this server runs text-only models (no vision)", "images")
    if _str(body, "template"):
        raise bad_request("'template' (a Go template) is not supported: edged renders the model's "
                          "own chat template; send raw: true with a formatted prompt instead",
                          "template")
    if _str(body, "suffix"):
        raise bad_request("'suffix' (fill-in-the-middle) is not supported", "suffix")
    raw = _bool(body, "raw")
    system = _str(body, "system") or None
    if raw and system:
        raise bad_request("'system' cannot be combined with raw: true (the prompt is used as it "
                          "is)", "system")
    context = []
    if body.get("context"):
        context = schemas._token_ids(body["context"], "context", vocab_size)
    common = _renamed(schemas.parse_generation, _openai_common(body), vocab_size)
    req = OllamaGenerate(**common, top_logprobs=_logprobs(body), prompt=prompt, system=system,
                         raw=raw, context=list(context), think=_think(body))
    return _finish(req, body)
