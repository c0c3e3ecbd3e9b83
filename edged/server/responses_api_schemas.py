"""Request validation for POST /v1/responses (the OpenAI Responses API).

A Responses body is translated to a /v1/chat/completions body (instructions, the conversation of
`previous_response_id` and the input items become chat messages; function tools, tool_choice and
text.format their chat forms) and validated by schemas.parse_chat: one set of rules for both
APIs, its errors renamed to the Responses fields. What edged cannot do (background responses,
images, hosted tools, include) is a 400 naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from edged.server import schemas
from edged.server.errors import APIError, bad_request
from edged.server.responses_api_store import ResponseStore, StoredResponse
from edged.server.schemas import ChatRequest
from edged.server.spec import (AnyOf, Anything, Array, Body, Boolean, Field, Integer, Number, Object,
                               String, Unsupported, fields)

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")
# edged's sampling extensions (as on /v1/chat/completions), handed to the chat parser unchanged
EXTENSIONS = ("seed", "top_k", "min_p", "stop", "presence_penalty", "frequency_penalty",
              "repetition_penalty", "logit_bias", "ignore_eos", "speculative", "keep_alive")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = ("auto", "concise", "detailed")
VERBOSITIES = ("low", "medium", "high")
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits


# -- the body's declaration (read first by parse_responses; /openapi.json publishes it) ---------
# Members whose rules need more than their shape (input items, metadata) are declared by shape and
# checked further below, so their errors keep naming the member at fault.

_SCHEMA = Anything(("object", "boolean", "string"), description="a JSON schema")
_TOOL = Object(fields=(
    Field("type", String(enum=("function",), why="only function tools (hosted tools such as "
                         "web_search need OpenAI's servers)"), required=True),
    Field("name", String(pattern=r"[A-Za-z0-9_.\-]{1,64}", why="1-64 of a-z, A-Z, 0-9, '_', '-', '.'"),
          required=True),
    Field("description", String()),
    Field("parameters", Anything(("object",)), description="a JSON Schema of an object"),
    Field("strict", Boolean())))
_TOOL_CHOICE = AnyOf((
    String(enum=("auto", "none", "required")),
    Object(fields=(Field("type", String(enum=("function", "allowed_tools")), required=True),
                   Field("name", String(), description="type function: the function"),
                   Field("mode", String(enum=("auto", "required")), description="type allowed_tools"),
                   Field("tools", Array(Anything(("object",))), description="type allowed_tools: "
                         "[{\"type\": \"function\", \"name\": ...}]")))),
    what="'auto', 'none', 'required' or an object")
_TEXT = Object(fields=(
    Field("format", Object(fields=(
        Field("type", String(enum=("text", "json_object", "json_schema")), required=True),
        Field("name", String(min_len=1), description="json_schema: required"),
        Field("schema", _SCHEMA, description="json_schema: required"),
        Field("strict", Boolean())))),
    Field("verbosity", String(enum=VERBOSITIES))))
_REASONING = Object(fields=(Field("effort", String(enum=EFFORTS), description="no effect"),
                            Field("summary", String(enum=SUMMARIES)),
                            Field("generate_summary", String(enum=SUMMARIES))))
RESPONSES = Body("ResponsesRequest", fields(
    schemas.MODEL,
    Field("input", AnyOf((String(), Array(Anything(), min_items=1, description="input item objects")),
                         what="a string or an array of input items"), required=True,
          description="a string, or items: message, function_call, function_call_output, reasoning"),
    Field("instructions", String()),
    Field("previous_response_id", String(), description="continue a stored response's conversation"),
    Field("stream", Boolean(), default=False, description="the API's typed server-sent events"),
    Field("stream_options", Object(fields=(Field("include_obfuscation", Boolean()),)),
          description="only with stream: true"),
    Field("store", Boolean(), default=True),
    Field("max_output_tokens", Integer(lo=1)),
    Field("temperature", Number(0.0, 2.0)),
    Field("top_p", Number(0.0, 1.0, lo_open=True)),
    Field("user", String()),
    Field("metadata", Anything(("object",)), description=f"at most {MAX_METADATA_KEYS} string values"),
    Field("tools", Array(_TOOL)),
    Field("tool_choice", _TOOL_CHOICE),
    Field("parallel_tool_calls", Boolean()),
    Field("text", _TEXT),
    Field("reasoning", _REASONING),
    Field("truncation", String(enum=("disabled", "auto")), description="only disabled"),
    Field("top_logprobs", Integer(0, schemas.MAX_TOP_LOGPROBS), description="only 0"),
    Field("include", Array(Anything()), description="only empty"),
    Field("background", Boolean(), description="only false"),
    Field("conversation", Unsupported(why="use previous_response_id")),
    Field("prompt", Unsupported(why="prompt templates live on OpenAI's servers")),
    Field("max_tool_calls", Unsupported(why="the model's calls are not capped")),
    *(f for f in schemas.GENERATION.fields if f.name in EXTENSIONS),
))


@dataclass
class ResponsesRequest:
    chat: ChatRequest  # what the chat pipeline generates from
    input_items: list[dict]  # this request's input, normalized (stored with the response)
    previous: StoredResponse | None
    store: bool
    echo: dict = field(default_factory=dict)  # request fields the Response object repeats

    @property
    def keep_alive(self) -> float | None:
        return self.chat.keep_alive


# -- input items -------------------------------------------------------------------------------

def _text_of_parts(parts: Any, where: str, allowed: tuple[str, ...]) -> list[dict]:
    if not isinstance(parts, list):
        raise bad_request(f"{where} must be a string or an array of content parts", where)
    out = []
    for k, p in enumerate(parts):
        at = f"{where}[{k}]"
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in MEDIA_PARTS:
            raise bad_request(f"{at}.type {kind!r} is not supported: edged serves text-only models",
                              f"{at}.type")
        if kind == "refusal" and isinstance(p.get("refusal"), str):
            out.append({"type": "refusal", "refusal": p["refusal"]})
            continue
        if kind not in allowed:
            raise bad_request(f"{at} must be a content part of type {' or '.join(allowed)}", at)
        if not isinstance(p.get("text"), str):
            raise bad_request(f"{at}.text must be a string", f"{at}.text")
        out.append({"type": kind, "text": p["text"]})
    return out


def _nonempty_str(item: dict, key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str) or not v:
        raise bad_request(f"{where}.{key} must be a non-empty string", f"{where}.{key}")
    return v


def _item(x: Any, where: str) -> dict:
    """One input item, validated and normalized: message, function_call, function_call_output
    or reasoning (an output item sent back as input keeps only what the prompt needs)."""
    if not isinstance(x, dict):
        raise bad_request(f"{where} must be an object", where)
    kind = x.get("type", "message" if "role" in x else None)
    if kind == "message":
        role = x.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        content = x.get("content")
        if not isinstance(content, str):
            content = _text_of_parts(content, f"{where}.content", TEXT_PARTS)
        return {"type": "message", "role": role, "content": content}
    if kind == "function_call":
        args = x.get("arguments")
        if not isinstance(args, str):
            raise bad_request(f"{where}.arguments must be a JSON string", f"{where}.arguments")
        return {"type": "function_call", "call_id": _nonempty_str(x, "call_id", where),
                "name": _nonempty_str(x, "name", where), "arguments": args}
    if kind == "function_call_output":
        out = x.get("output")
        if not isinstance(out, str):
            out = _flat(_text_of_parts(out, f"{where}.output", ("input_text",)))
        return {"type": "function_call_output", "call_id": _nonempty_str(x, "call_id", where),
                "output": out}
    if kind == "reasoning":
        content = x.get("content") or []
        summary = x.get("summary") or []
        if not isinstance(content, list) or not all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            raise bad_request(f"{where}.content must be an array of reasoning_text parts",
                              f"{where}.content")
        if not isinstance(summary, list) or not all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in summary):
            raise bad_request(f"{where}.summary must be an array of summary_text parts",
                              f"{where}.summary")
        return {"type": "reasoning",
                "content": [{"type": "reasoning_text", "text": p["text"]} for p in content],
                "summary": [{"type": "summary_text", "text": p["text"]} for p in summary]}
    if not isinstance(kind, str):
        raise bad_request(f"{where} needs a 'type' (or a 'role' for a message)", where)
    raise bad_request(f"{where}.type {kind[:40]!r} is not supported; use message, function_call, "
                      "function_call_output or reasoning", f"{where}.type")


def parse_input(v: Any) -> list[dict]:
    if isinstance(v, str):
        return [{"type": "message", "role": "user", "content": v}]
    if not isinstance(v, list) or not v:
        raise bad_request("'input' must be a string or a non-empty array of input items", "input")
    return [_item(x, f"input[{i}]") for i, x in enumerate(v)]


def _flat(content) -> str:
    """Content parts as one string (joined as chat templates get them: edged.chat)."""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", p.get("refusal", "")) for p in content)


def to_messages(items: list[dict], instructions: str | None) -> list[dict]:
    """Chat messages of a conversation's items: a function call joins the assistant message
    before it (one turn, as chat has it), a reasoning item goes to the next assistant message as
    reasoning_content, and a tool result carries its function's name."""
    msgs: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    names: dict[str, str] = {}
    reasoning: str | None = None
    for it in items:
        kind = it["type"]
        if kind == "reasoning":
            text = _flat(it.get("content") or it.get("summary") or [])
            reasoning = text if reasoning is None else f"{reasoning}\n{text}"
            continue
        if kind == "function_call":
            names[it["call_id"]] = it["name"]
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1] = {**msgs[-1], "tool_calls": [*msgs[-1].get("tool_calls", ()), call]}
                continue
            m = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif kind == "function_call_output":
            m = {"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]}
            if it["call_id"] in names:
                m["name"] = names[it["call_id"]]
        else:
            m = {"role": it["role"], "content": _flat(it["content"])}
        if reasoning is not None and m["role"] == "assistant":
            m["reasoning_content"], reasoning = reasoning, None
        msgs.append(m)
    return msgs


# -- tools, tool_choice, text.format ------------------------------------------------------------

def _tools(v: Any) -> tuple[list, list]:
    """(the tools as the Response repeats them, the same as chat tools)."""
    if v is None:
        return [], []
    if not isinstance(v, list):
        raise bad_request("'tools' must be an array", "tools")
    echo, chat = [], []
    for i, t in enumerate(v):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad_request(f"{where} must be an object", where)
        kind = t.get("type")
        if kind != "function":
            raise bad_request(f"{where}.type {kind!r} is not supported: only function tools "
                              "(hosted tools such as web_search need OpenAI's servers)", f"{where}.type")
        strict = t.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(f"{where}.strict must be a boolean", f"{where}.strict")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        chat.append({"type": "function", "function": fn})
        echo.append({"type": "function", "name": t.get("name"), "description": t.get("description"),
                     "parameters": t.get("parameters"), "strict": strict})
    return echo, chat


def _tool_choice(v: Any, chat_tools: list) -> tuple[Any, list]:
    """(chat's tool_choice, the chat tools it allows)."""
    if v is None or isinstance(v, str):
        return v, chat_tools  # "none" / "auto" / "required", checked by the chat parser
    if not isinstance(v, dict):
        raise bad_request("'tool_choice' must be a string or an object", "tool_choice")
    kind = v.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": v.get("name")}}, chat_tools
    if kind == "allowed_tools":
        mode, allowed = v.get("mode"), v.get("tools")
        if mode not in ("auto", "required"):
            raise bad_request("tool_choice.mode must be 'auto' or 'required'", "tool_choice.mode")
        if not isinstance(allowed, list) or not all(
                isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)
                for t in allowed):
            raise bad_request("tool_choice.tools must be an array of {\"type\": \"function\", "
                              "\"name\": ...}", "tool_choice.tools")
        names = {t["name"] for t in allowed}
        known = {t["function"].get("name") for t in chat_tools}
        for k, t in enumerate(allowed):
            if t["name"] not in known:
                raise bad_request(f"tool_choice.tools[{k}].name {t['name']!r} is not a function in "
                                  "'tools'", f"tool_choice.tools[{k}].name")
        return mode, [t for t in chat_tools if t["function"].get("name") in names]
    raise bad_request(f"tool_choice.type {kind!r} is not supported: 'function' or 'allowed_tools'",
                      "tool_choice.type")


def _text(v: Any) -> tuple[dict, dict | None]:
    """(text as the Response repeats it, chat's response_format or None)."""
    if v is None:
        return {"format": {"type": "text"}}, None
    if not isinstance(v, dict):
        raise bad_request("'text' must be an object", "text")
    verbosity = v.get("verbosity")
    if verbosity is not None and verbosity not in VERBOSITIES:
        raise bad_request(f"text.verbosity must be one of {', '.join(VERBOSITIES)}", "text.verbosity")
    fmt = v.get("format")
    echo = {"format": fmt if fmt is not None else {"type": "text"}}
    if verbosity is not None:
        echo["verbosity"] = verbosity
    if fmt is None:
        return echo, None
    if not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str) or not fmt["name"]:
            raise bad_request("text.format.name must be a non-empty string", "text.format.name")
        if fmt.get("schema") is None:
            raise bad_request("text.format.schema is required for type json_schema",
                              "text.format.schema")
        js = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return echo, {"type": "json_schema", "json_schema": js}
    if kind in ("text", "json_object"):
        return echo, {"type": kind}
    raise bad_request("text.format.type must be 'text', 'json_object' or 'json_schema'",
                      "text.format.type")


# -- the rest ----------------------------------------------------------------------------------

def _metadata(body: dict) -> dict:
    v = body["metadata"]
    if v is None:
        return {}
    if len(v) > MAX_METADATA_KEYS:
        raise bad_request(f"'metadata' must be an object of at most {MAX_METADATA_KEYS} string "
                          "values", "metadata")
    for k, val in v.items():
        if len(k) > MAX_METADATA_KEY or not isinstance(val, str) or len(val) > MAX_METADATA_VALUE:
            raise bad_request(f"metadata.{k[:64]}: keys have at most {MAX_METADATA_KEY} characters "
                              f"and values are strings of at most {MAX_METADATA_VALUE}", "metadata")
    return v


def _reasoning(body: dict) -> dict:
    """`reasoning` is validated and repeated; its effort has no effect (a model that thinks
    thinks as its template says)."""
    v = body["reasoning"]
    if v is None:
        return {"effort": None, "summary": None}
    return {"effort": v.get("effort"), "summary": v.get("summary", v.get("generate_summary"))}


def _refuse_unsupported(body: dict) -> None:
    if body["background"]:
        raise bad_request("'background' responses are not supported: send the request and wait, "
                          "or stream it", "background")
    include = body["include"]
    if include:
        raise bad_request(f"include[0] {str(include[0])[:60]!r} is not supported (no extra "
                          "output data is available)", "include[0]")
    if body["truncation"] == "auto":
        raise bad_request("'truncation' 'auto' is not supported: a conversation longer than the "
                          "context is a 400", "truncation")
    if body["top_logprobs"]:
        raise bad_request("'top_logprobs' is not supported on /v1/responses", "top_logprobs")
    if body["stream_options"] is not None and not body["stream"]:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")


_RENAMES = (("response_format.json_schema.", "text.format."), ("response_format.json_schema", "text.format"),
            ("response_format", "text.format"), ("max_tokens", "max_output_tokens"),
            ("messages", "input"), ("tool_choice.function.name", "tool_choice.name"))
_TOOL_FIELD = re.compile(r"^tools\[(\d+)\]\.function")


def renamed(e: APIError) -> APIError:
    """An error of the chat parser (or of admission) reworded to name the Responses field."""
    p = e.param
    if not p:
        return e
    new = _TOOL_FIELD.sub(r"tools[\1]", p)
    for old, rep in _RENAMES:
        if new.startswith(old):
            new = rep + new[len(old):]
            break
    if new == p:
        return e
    msg = e.message.replace(f"'{p}'", f"'{new}'")
    if msg.startswith(p):
        msg = new + msg[len(p):]
    if new not in msg:  # e.g. the context check, which names no field in its text
        msg = f"{msg} ('{new}')"
    return APIError(e.status, msg, param=new, code=e.code, headers=e.headers)


def parse_responses(body: Any, vocab_size: int, store: ResponseStore) -> ResponsesRequest:
    """Validate a /v1/responses body; previous_response_id is looked up in `store` (404 when it
    is not there)."""
    raw, body = body, RESPONSES.read(body, vocab_size=vocab_size)  # every declared member, checked
    _refuse_unsupported(body)
    items = parse_input(body["input"])
    instructions = body["instructions"]
    prev_id = body["previous_response_id"]
    previous = None
    if prev_id is not None:
        previous = store.get(prev_id)
        if previous is None:
            raise APIError(404, f"previous_response_id {prev_id[:80]!r} is not stored: it expired, "
                           "was deleted, or was created with store: false",
                           param="previous_response_id", code="not_found")
    tools_echo, chat_tools = _tools(body.get("tools"))
    raw_choice = body.get("tool_choice")
    tool_choice, chat_tools = _tool_choice(raw_choice, chat_tools)
    text_echo, response_format = _text(body.get("text"))
    history = previous.conversation() if previous is not None else []
    chat_body = {"messages": to_messages(history + items, instructions),
                 "model": body.get("model"), "stream": body.get("stream"),
                 "max_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
                 "top_p": body.get("top_p"), "user": body.get("user"),
                 "parallel_tool_calls": body.get("parallel_tool_calls"),
                 **{k: raw[k] for k in EXTENSIONS if k in raw}}  # as sent: the chat parser reads them
    if chat_tools:
        chat_body.update(tools=chat_tools, tool_choice=tool_choice)
    elif tool_choice not in (None, "auto", "none"):
        chat_body["tool_choice"] = tool_choice  # the chat parser's "needs tools" error
    if response_format is not None:
        chat_body["response_format"] = response_format
    try:
        chat = schemas.parse_chat(chat_body, vocab_size)
    except APIError as e:
        raise renamed(e) from None
    store_it = body["store"]
    echo = {"instructions": instructions, "max_output_tokens": chat.max_tokens,
            "metadata": _metadata(body), "parallel_tool_calls": chat.tool_request.parallel,
            "previous_response_id": prev_id, "reasoning": _reasoning(body), "store": store_it,
            "temperature": chat.params.temperature, "text": text_echo,
            "tool_choice": raw_choice if raw_choice is not None else "auto", "tools": tools_echo,
            "top_p": chat.params.top_p, "truncation": "disabled", "user": chat_body["user"],
            "background": False}
    return ResponsesRequest(chat, items, previous, store_it, echo)
