"""Request validation for the OpenAI-compatible endpoints.

Each `parse_*` takes the decoded JSON body and returns a plain dataclass, or raises APIError(400)
naming the offending field. Unknown fields are ignored, as OpenAI's server does; wrong types and
out-of-range values are errors, never silently clamped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edged.sampling import SamplingParams
from edged.server.errors import APIError, bad_request
from edged.server.keep_alive import parse_keep_alive
from edged.structured import Constraint, ConstraintError, constraint_from_request
from edged.toolcall import ToolRequest, ToolError, parse_tool_request

MAX_N = 8  # choices per request
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_TOP_LOGPROBS = 20
MAX_PROMPTS = 32  # prompts in one /v1/completions batch
MAX_STOP_CHARS = 256

_MISSING = object()


@dataclass
class GenerationRequest:
    """What chat and completions have in common, validated."""

    model: str | None
    params: SamplingParams  # seed is the request's; choice i gets seed + i
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None  # None: the endpoint's default
    top_logprobs: int | None = None  # None: no logprobs; 0..20: chosen token (+ that many top)
    # response_format / json_schema / grammar / structured_outputs (edged.structured.forms)
    constraint: Constraint | None = None
    keep_alive: float | None = None  # seconds the model stays loaded afterwards; None: --keep-alive


@dataclass
class ChatRequest(GenerationRequest):
    messages: list = field(default_factory=list)
    tools: list | None = None
    tool_request: ToolRequest | None = None  # tools / tool_choice / parallel_tool_calls, validated
    reasoning_format: str | None = None  # per-request override of --reasoning-format


@dataclass
class CompletionRequest(GenerationRequest):
    prompts: list = field(default_factory=list)  # each a str or a list[int]
    echo: bool = False


@dataclass
class TokenizeRequest:
    content: str
    add_special: bool = False
    with_pieces: bool = False


@dataclass
class DetokenizeRequest:
    tokens: list[int]


# -- typed field readers ---------------------------------------------------------------------------

def _type_name(v: Any) -> str:
    return "null" if v is None else {bool: "boolean", int: "integer", float: "number", str: "string",
                                     list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _opt(body: dict, name: str):
    """The field's value, or _MISSING when absent or null (OpenAI treats null as unset)."""
    v = body.get(name, _MISSING)
    return _MISSING if v is None else v


def _bool(body: dict, name: str, default: bool = False) -> bool:
    v = _opt(body, name)
    if v is _MISSING:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be a boolean, got {_type_name(v)}", name)
    return v


def _int(body: dict, name: str, lo: int | None = None, hi: int | None = None, default=None):
    v = _opt(body, name)
    if v is _MISSING:
        return default
    # 2.0 is accepted as 2 (JSON has one number type); 2.5 and true are not
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{name}' must be an integer, got {_type_name(v)}", name)
    if lo is not None and v < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise bad_request(f"'{name}' must be <= {hi}, got {v}", name)
    return v


def _num(body: dict, name: str, lo: float, hi: float, default=None, lo_open: bool = False):
    v = _opt(body, name)
    if v is _MISSING:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(f"'{name}' must be a finite number, got {_type_name(v)}", name)
    if (v <= lo if lo_open else v < lo) or v > hi:
        interval = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise bad_request(f"'{name}' must be in {interval}, got {v}", name)
    return float(v)


def _str(body: dict, name: str, default=None):
    v = _opt(body, name)
    if v is _MISSING:
        return default
    if not isinstance(v, str):
        raise bad_request(f"'{name}' must be a string, got {_type_name(v)}", name)
    return v


def _token_ids(v: Any, name: str, vocab_size: int) -> list[int]:
    if not isinstance(v, list) or not v:
        raise bad_request(f"'{name}' must be a non-empty array of token ids", name)
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad_request(f"'{name}' must hold integer token ids, got {_type_name(t)}", name)
        if not 0 <= t < vocab_size:
            raise bad_request(f"token id {t} in '{name}' is outside the vocabulary "
                              f"(0..{vocab_size - 1})", name, code="invalid_token_id")
    return v


# -- shared generation fields ----------------------------------------------------------------------

def _stop(body: dict) -> tuple[str, ...]:
    v = _opt(body, "stop")
    if v is _MISSING:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or an array of strings", "stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"'stop' holds at most {MAX_STOP} strings, got {len(stops)}", "stop")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"each stop string must have 1..{MAX_STOP_CHARS} characters", "stop")
    return tuple(stops)


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    v = _opt(body, "logit_bias")
    if v is _MISSING:
        return {}
    if not isinstance(v, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias")
    out = {}
    for k, b in v.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad_request(f"'logit_bias' key {k!r} is not a token id", "logit_bias") from None
        if not 0 <= tid < vocab_size:
            raise bad_request(f"'logit_bias' token id {tid} is outside the vocabulary "
                              f"(0..{vocab_size - 1})", "logit_bias", code="invalid_token_id")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise bad_request(f"'logit_bias' value for {tid} must be a number in [-100, 100]",
                              "logit_bias")
        out[tid] = float(b)
    return out


def _common(body: Any, vocab_size: int) -> dict:
    """Fields shared by chat and completions, as GenerationRequest keyword arguments."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_type_name(body)}")
    model = _str(body, "model")
    _str(body, "user")  # accepted, unused; still must be a string
    stream = _bool(body, "stream")
    include_usage = False
    so = _opt(body, "stream_options")
    if so is not _MISSING:
        if not isinstance(so, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = _bool(so, "include_usage")
    max_tokens = _int(body, "max_tokens", lo=1)
    mct = _int(body, "max_completion_tokens", lo=1)
    if mct is not None:
        max_tokens = mct if max_tokens is None else min(max_tokens, mct)
    try:
        constraint = constraint_from_request(body)
    except ConstraintError as e:
        raise bad_request(f"{e.field}: {e.message}", e.field) from None
    seed = _int(body, "seed", lo=-(2**63), hi=2**64 - 1)
    if seed is not None and seed < 0:  # OpenAI accepts negative seeds
        seed %= 2**64
    try:
        params = SamplingParams(
            temperature=_num(body, "temperature", 0.0, 2.0, default=1.0),
            top_p=_num(body, "top_p", 0.0, 1.0, default=1.0, lo_open=True),
            top_k=_int(body, "top_k", lo=-1, hi=vocab_size, default=0),
            min_p=_num(body, "min_p", 0.0, 1.0, default=0.0),
            presence_penalty=_num(body, "presence_penalty", -2.0, 2.0, default=0.0),
            frequency_penalty=_num(body, "frequency_penalty", -2.0, 2.0, default=0.0),
            repetition_penalty=_num(body, "repetition_penalty", 0.0, 10.0, default=1.0, lo_open=True),
            logit_bias=_logit_bias(body, vocab_size),
            seed=seed,
            stop=_stop(body),
            ignore_eos=_bool(body, "ignore_eos"),
        )
    except ValueError as e:  # anything SamplingParams checks beyond the ranges above
        if isinstance(e, APIError):
            raise
        raise bad_request(str(e)) from None
    return dict(model=model, params=params, n=_int(body, "n", lo=1, hi=MAX_N, default=1),
                stream=stream, include_usage=include_usage, max_tokens=max_tokens,
                constraint=constraint, keep_alive=_keep_alive(body))


def _keep_alive(body: dict) -> float | None:
    """Ollama's keep_alive, an extension field: "5m", seconds, 0 (unload after), -1 (never)."""
    v = _opt(body, "keep_alive")
    if v is _MISSING:
        return None
    try:
        return parse_keep_alive(v)
    except ValueError as e:
        raise bad_request(str(e), "keep_alive") from None


def requested_model(body: Any) -> str | None:
    """The body's `model` (None when absent), checked before the model is loaded to parse the
    rest against its vocabulary."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_type_name(body)}")
    return _str(body, "model")


# -- endpoints -------------------------------------------------------------------------------------

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's; "developer" renders as system


def _message(m: Any, i: int) -> None:
    """One chat message: role, text content (or null), an assistant's tool_calls, a tool's id."""
    if not isinstance(m, dict):
        raise bad_request(f"messages[{i}] must be an object", "messages")
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise bad_request(f"messages[{i}].role must be a non-empty string", "messages")
    if role not in CHAT_ROLES:
        raise bad_request(f"messages[{i}].role {role[:40]!r} is not one of {', '.join(CHAT_ROLES)}",
                          "messages")
    content = m.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise bad_request(f"messages[{i}].content must be a string, an array of parts or null",
                          "messages")
    if isinstance(content, list):
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad_request(f"messages[{i}].content: only text parts are supported",
                                  "messages")
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad_request(f"messages[{i}].tool_calls must be an array", "messages")
        for k, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad_request(f"messages[{i}].tool_calls[{k}].function.name must be a string",
                                  "messages")
            if not isinstance(fn.get("arguments", ""), (str, dict)):
                raise bad_request(f"messages[{i}].tool_calls[{k}].function.arguments must be a "
                                  "JSON string", "messages")
    if m.get("tool_call_id") is not None and not isinstance(m["tool_call_id"], str):
        raise bad_request(f"messages[{i}].tool_call_id must be a string", "messages")


def _tools(body: dict) -> ToolRequest:
    try:
        return parse_tool_request(body.get("tools"), body.get("tool_choice"),
                                  body.get("parallel_tool_calls"))
    except ToolError as e:
        raise bad_request(f"{e.field}: {e.message}", e.field) from None


def parse_chat(body: Any, vocab_size: int) -> ChatRequest:
    """Validate a /v1/chat/completions body."""
    common = _common(body, vocab_size)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array of messages", "messages")
    for i, m in enumerate(messages):
        _message(m, i)
    tool_request = _tools(body)
    if tool_request.active and common["constraint"] is not None:
        field_ = common["constraint"].field.split(".")[0]
        raise bad_request(f"'{field_}' cannot be combined with tools (unless tool_choice is "
                          "'none')", field_)
    reasoning_format = _str(body, "reasoning_format")
    if reasoning_format == "deepseek":  # llama-server's name for the same split
        reasoning_format = "auto"
    if reasoning_format not in (None, "none", "auto"):
        raise bad_request("'reasoning_format' must be 'none' or 'auto'", "reasoning_format")
    top = None
    if _bool(body, "logprobs"):
        top = _int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS, default=0)
    elif _opt(body, "top_logprobs") is not _MISSING:
        _int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
        raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    tools = _opt(body, "tools")
    if tools is not _MISSING and not isinstance(tools, list):
        raise bad_request("'tools' must be an array", "tools")
    return ChatRequest(**common, top_logprobs=top, messages=messages,
                       tools=None if tools is _MISSING else tools, tool_request=tool_request,
                       reasoning_format=reasoning_format)


def parse_completion(body: Any, vocab_size: int) -> CompletionRequest:
    """Validate a /v1/completions body; `prompts` becomes a list of strings and token-id lists."""
    common = _common(body, vocab_size)
    p = body.get("prompt", _MISSING)
    if p is _MISSING or p is None:
        raise bad_request("'prompt' is required", "prompt")
    if isinstance(p, str):
        prompts = [p]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        prompts = [_token_ids(p, "prompt", vocab_size)]
    elif isinstance(p, list) and p and all(isinstance(x, list) for x in p):
        prompts = [_token_ids(x, "prompt", vocab_size) for x in p]
    else:
        raise bad_request("'prompt' must be a string, an array of strings, an array of token ids "
                          "or an array of token-id arrays (non-empty)", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request", "prompt")
    if len(prompts) * common["n"] > MAX_PROMPTS:
        raise bad_request(f"prompts x n must be <= {MAX_PROMPTS}", "n")
    top = _int(body, "logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    echo = _bool(body, "echo")
    if echo and top is not None:
        raise bad_request("'echo' with 'logprobs' (prompt log-probabilities) is not supported",
                          "echo")
    if _opt(body, "suffix") is not _MISSING:
        raise bad_request("'suffix' is not supported", "suffix")
    best_of = _int(body, "best_of", lo=1, hi=MAX_N)
    if best_of is not None and best_of != common["n"]:
        raise bad_request("'best_of' other than n is not supported", "best_of")
    return CompletionRequest(**common, top_logprobs=top, prompts=prompts, echo=echo)


def parse_tokenize(body: Any) -> TokenizeRequest:
    """Validate a /tokenize body (llama-server's shape: content, add_special, with_pieces)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    content = body.get("content")
    if not isinstance(content, str):
        raise bad_request("'content' must be a string", "content")
    return TokenizeRequest(content, _bool(body, "add_special"), _bool(body, "with_pieces"))


def parse_detokenize(body: Any, vocab_size: int) -> DetokenizeRequest:
    """Validate a /detokenize body: {"tokens": [ids]} (an empty list gives "")."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    tokens = body.get("tokens")
    if tokens == []:
        return DetokenizeRequest([])
    return DetokenizeRequest(_token_ids(tokens, "tokens", vocab_size))
