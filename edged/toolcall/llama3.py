"""Llama 3.1-3.3: a JSON call ``{"name": …, "parameters": …}`` (optionally ``"type": "function"``
first; several separated by ``;``), or ``<|python_tag|>`` followed by a JSON call, a built-in
``tool.call(arg=…)`` or raw Python code (the ``python`` / ``code_interpreter`` tool)."""

from __future__ import annotations

import ast
import json
import re

from .base import ToolFormat
from .calls import RawCall
from .constraint import ConstraintSpec, TokenRef, Trigger, any_of, call_schema
from .jsonscan import BAD, DONE, PARTIAL, Block, match_call_object, skip_ws

PYTHON_TAG = "<|python_tag|>"
_ARGS_KEYS = ("parameters", "arguments")
_SEPARATOR = re.compile(r"[ \t\r\n]*;")
_BUILTIN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.call\((.*)\)\s*$", re.S)
_CODE_TOOLS = ("python", "code_interpreter")


class Llama3Format(ToolFormat):
    name = "llama3"
    triggers = (PYTHON_TAG, "{")
    special_tokens = (PYTHON_TAG,)

    def parse_block(self, text, start, trigger, names, final) -> Block:
        if trigger == "{":
            return _json_call(text, start, names)
        i = skip_ws(text, start + len(PYTHON_TAG))
        if i < len(text) and text[i] == "{":
            return _json_call(text, i, names)
        if not final:
            return Block(PARTIAL)  # code or a built-in call: known only when the output ends
        call = _python_tag_call(text[i:].strip(), names)
        return Block(DONE, [call], len(text)) if call else Block(BAD)

    def constraint(self, request, token_ref: TokenRef | None = None) -> ConstraintSpec | None:
        if not request.active:
            return None
        # Llama 3.x templates describe one call per turn, so the grammar allows one.
        schema = any_of([call_schema(f, "parameters") for f in request.selected()])
        lazy = request.choice == "auto"
        return ConstraintSpec("json_schema", schema=schema, lazy=lazy,
                              triggers=[Trigger("{", at_start=True)] if lazy else [],
                              special_tokens=self.special_tokens)


def _json_call(text: str, start: int, names) -> Block:
    block = match_call_object(text, start, _ARGS_KEYS, names)
    if block.status == DONE:
        m = _SEPARATOR.match(text, block.end)
        if m:
            block.end = m.end()
    return block


def _python_tag_call(body: str, names) -> RawCall | None:
    """A built-in ``name.call(k=v, …)`` or, for a code tool, the code itself."""
    m = _BUILTIN.match(body)
    if m and (names is None or m.group(1) in names):
        try:
            node = ast.parse(f"f({m.group(2)})", mode="eval").body
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            if not node.args:
                return RawCall(m.group(1), json.dumps(args, ensure_ascii=False))
        except (SyntaxError, ValueError):
            pass
    for tool in _CODE_TOOLS:
        if body and (names is None or tool in names):
            return RawCall(tool, json.dumps({"code": body}, ensure_ascii=False))
    return None

