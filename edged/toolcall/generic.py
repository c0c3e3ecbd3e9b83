"""The generic format, for templates with no tool syntax of their own (llama.cpp's generic
handler): the whole answer is one JSON object under a grammar, either
``{"tool_calls": [{"name": …, "arguments": {…}}, …]}`` or ``{"response": "…"}``.
``{"tool_call": {…}}`` (llama.cpp's single-call shape) is accepted too."""

from __future__ import annotations

import json

from .base import ToolFormat
from .calls import Scan
from .constraint import ConstraintSpec, TokenRef, array_of_calls
from .jsonscan import (DONE, INCOMPLETE, decode_partial_string, loads, match_call_array,
                       match_call_object, skip_ws, string_end, value_end)

_ARGS_KEYS = ("arguments", "parameters")

SYSTEM_HINT = ("Respond in JSON format, either with `tool_calls` (a request to call tools) or "
               "with `response` (a reply to the user's request).")


def tools_system_prompt(request) -> str:
    """A system-prompt text that lists the tools and the answer shape, for templates that
    cannot render ``tools`` themselves."""
    tools = [{"name": f.name, "description": f.description or "", "parameters": f.parameters}
             for f in request.functions]
    return ("You can call these tools:\n" + json.dumps(tools, ensure_ascii=False, indent=2)
            + "\n\n" + SYSTEM_HINT)


class GenericFormat(ToolFormat):
    name = "generic"
    triggers = ()

    def scan(self, text: str, final: bool, names: frozenset[str] | None = None) -> Scan:
        i = skip_ws(text, 0)
        if i < len(text) and text[i] != "{":
            return Scan(text.strip())  # not the JSON answer at all: plain content
        key, k = _first_key(text, i)
        if key is None:
            return Scan(text.strip() if final and k != INCOMPLETE else "")
        if key == "response":
            return _response(text, i, k, final)
        opener = text[k] if key in ("tool_calls", "tool_call") and k < len(text) else ""
        if opener in ("[", "{"):
            block = (match_call_array(text, k, _ARGS_KEYS, names, final) if opener == "["
                     else match_call_object(text, k, _ARGS_KEYS, names))
            if block.status == DONE or not final:
                return Scan("", block.calls)
        return Scan(text.strip() if final else "")

    def constraint(self, request, token_ref: TokenRef | None = None) -> ConstraintSpec | None:
        if not request.active:
            return None
        calls = {"type": "object",
                 "properties": {"tool_calls": array_of_calls(request.selected(), "arguments",
                                                             request.max_calls)},
                 "required": ["tool_calls"], "additionalProperties": False}
        schema = calls
        if request.choice == "auto":
            response = {"type": "object", "properties": {"response": {"type": "string"}},
                        "required": ["response"], "additionalProperties": False}
            schema = {"anyOf": [calls, response]}
        return ConstraintSpec("json_schema", schema=schema)


def _first_key(text: str, i: int) -> tuple[str | None, int]:
    """The first key of the object at ``i`` and where its value starts (INCOMPLETE: unknown yet)."""
    j = skip_ws(text, i + 1)
    if j >= len(text):
        return None, INCOMPLETE
    if text[j] != '"':
        return None, 0
    kend = string_end(text, j)
    if kend == INCOMPLETE:
        return None, INCOMPLETE
    c = skip_ws(text, kend)
    if c >= len(text):
        return None, INCOMPLETE
    if text[c] != ":":
        return None, 0
    return loads(text[j:kend]), skip_ws(text, c + 1)


def _response(text: str, i: int, k: int, final: bool) -> Scan:
    """The reply text; a truncated string gives what was decoded, as a length-cut reply."""
    end = value_end(text, i)
    if end > 0:
        value = loads(text[i:end]).get("response")
        return Scan(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    if k < len(text) and text[k] == '"':
        return Scan(decode_partial_string(text, k)[0])
    return Scan(text.strip() if final else "")
