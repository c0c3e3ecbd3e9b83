"""Mistral: ``[TOOL_CALLS][{"name": …, "arguments": …}, …]`` (Nemo, Small 3, v3-v7), and the
v11+ form ``[TOOL_CALLS]name[ARGS]{…}`` (optionally ``[CALL_ID]id`` before ``[ARGS]``), one
``[TOOL_CALLS]`` per call."""

from __future__ import annotations

import json
import re

from .base import ToolFormat
from .calls import RawCall, random_alnum
from .constraint import (ConstraintSpec, TokenRef, Trigger, array_of_calls, bounded_json, lark_repeat,
                         literal)
from .jsonscan import (BAD, DONE, INCOMPLETE, MALFORMED, NOT_CALL, PARTIAL, Block,
                       match_call_array, match_call_object, skip_ws, value_end)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ARGS_KEYS = ("arguments", "parameters")


class MistralFormat(ToolFormat):
    name = "mistral"
    triggers = (TOOL_CALLS,)
    special_tokens = (TOOL_CALLS,)

    def __init__(self, args_form: bool = False):
        # args_form: the template writes calls as name[ARGS]{…} (v11+), not a JSON array.
        self.args_form = args_form
        if args_form:
            self.name = "mistral-args"
            self.special_tokens = (TOOL_CALLS, ARGS, CALL_ID)

    def new_id(self) -> str:
        return random_alnum(9)  # Mistral templates reject ids that are not 9 alphanumerics

    def parse_block(self, text, start, trigger, names, final) -> Block:
        i = skip_ws(text, start + len(TOOL_CALLS))
        if i >= len(text):
            return Block(PARTIAL)
        if text[i] == "[":
            return match_call_array(text, i, _ARGS_KEYS, names, final)
        if text[i] == "{":
            return match_call_object(text, i, _ARGS_KEYS, names)
        return _args_form_call(text, i, names)

    def constraint(self, request, token_ref: TokenRef | None = None) -> ConstraintSpec | None:
        if not request.active:
            return None
        head = literal(TOOL_CALLS, token_ref)
        if self.args_form:
            alts = " | ".join(f"{literal(f.name, None)} {literal(ARGS, token_ref)} args_{i}"
                              for i, f in enumerate(request.selected()))
            rules = "".join(f"args_{i}: %json {_dumps(bounded_json(f.parameters))}\n"
                            for i, f in enumerate(request.selected()))
            lark = (lark_repeat("start", "call", "", request.max_calls)
                    + f"call: {head} ({alts})\n" + rules)
        else:
            schema = array_of_calls(request.selected(), "arguments", request.max_calls)
            lark = f"start: {head} calls\ncalls: %json {_dumps(bounded_json(schema))}\n"
        lazy = request.choice == "auto"
        return ConstraintSpec("lark", lark=lark, lazy=lazy,
                              triggers=[Trigger(TOOL_CALLS)] if lazy else [],
                              special_tokens=self.special_tokens)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _args_form_call(text: str, i: int, names) -> Block:
    m = _NAME.match(text, i)
    if not m:
        return Block(NOT_CALL)
    name, j = m.group(), m.end()
    if j < len(text) and text.startswith(CALL_ID, j):
        idm = _NAME.match(text, j + len(CALL_ID))
        j = idm.end() if idm else j + len(CALL_ID)
    tail = text[j:]
    if any(len(tail) < len(tag) and tag.startswith(tail) for tag in (ARGS, CALL_ID)):
        return Block(PARTIAL)
    if not tail.startswith(ARGS) or (names is not None and name not in names):
        return Block(NOT_CALL)
    k = skip_ws(text, j + len(ARGS))
    end = value_end(text, k)
    if k >= len(text) or (end == INCOMPLETE and text[k] != "{"):
        return Block(PARTIAL)
    if text[k] != "{" or end == MALFORMED:
        return Block(BAD)
    if end == INCOMPLETE:
        return Block(PARTIAL, [RawCall(name, text[k:], complete=False)])
    return Block(DONE, [RawCall(name, text[k:end])], end)
