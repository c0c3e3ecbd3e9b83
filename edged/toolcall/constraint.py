"""What the constrained-decoding side gets for a tool request: a schema or a Lark grammar.

Data only; the Lark text is llguidance's dialect (``%json {…}`` embeds a JSON schema). Literals
that are special tokens in the model's vocabulary (``<|python_tag|>``, ``[TOOL_CALLS]``) must be
written as token references there, so the builders take a ``token_ref`` callback that returns
the reference (e.g. ``<[128010]>``) for such a literal, or None to quote it as text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from .tools import Function

TokenRef = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Trigger:
    """Text at which a lazy grammar switches on; ``at_start``: only if the output begins so."""
    text: str
    at_start: bool = False


@dataclass
class ConstraintSpec:
    """``kind`` "json_schema" (``schema`` set) or "lark" (``lark`` set).

    ``lazy``: generation is free until one of ``triggers`` appears; the grammar then matches
    from the trigger's first character on (feed the trigger text to the matcher first), as
    llama.cpp's lazy grammars do. Not lazy: the grammar applies from the first token.
    ``start_after``: the grammar (lazy or not) applies only once this text (the end of the
    reasoning block) has been generated; the thinking itself is never constrained.
    """
    kind: str
    schema: dict | None = None
    lark: str | None = None
    lazy: bool = False
    triggers: list[Trigger] = field(default_factory=list)
    special_tokens: tuple[str, ...] = ()
    start_after: str | None = None

    def grammar_text(self) -> str:
        """The grammar as one Lark text (a schema becomes ``start: %json {…}``)."""
        if self.kind == "lark":
            return self.lark
        return "start: %json " + json.dumps(self.schema, ensure_ascii=False) + "\n"


def literal(text: str, token_ref: TokenRef | None) -> str:
    ref = token_ref(text) if token_ref else None
    return ref if ref else json.dumps(text, ensure_ascii=False)


def call_schema(fn: Function, args_key: str = "arguments") -> dict:
    """A call object naming ``fn``: ``{"name": <const>, args_key: <parameters>}``."""
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "const": fn.name}, args_key: fn.parameters},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def any_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def array_of_calls(functions, args_key: str, max_calls: int | None) -> dict:
    schema = {"type": "array", "items": any_of([call_schema(f, args_key) for f in functions]),
              "minItems": 1}
    if max_calls is not None:
        schema["maxItems"] = max_calls
    return schema


def lark_repeat(start_rule: str, call_rule: str, sep: str, max_calls: int | None) -> str:
    """``start: call`` (one call) or ``start: call (sep call)*`` (any number, at least one)."""
    if max_calls == 1:
        return f"{start_rule}: {call_rule}\n"
    if not sep:
        return f"{start_rule}: {call_rule}+\n"
    return f"{start_rule}: {call_rule} ({json.dumps(sep)} {call_rule})*\n"


def bounded_json(schema: dict) -> dict:
    """The schema with llguidance's JSON options set to edged's bounded whitespace (a ``%json``
    rule inside Lark otherwise lets any run of whitespace sit between JSON tokens)."""
    from edged.structured.json_grammar import json_options

    return {"x-guidance": json_options(), **schema}


def json_rules(functions, args_key: str, prefix: str = "call_json") -> tuple[str, str]:
    """One ``%json`` rule per function; returns (the rules' text, an alternative of them)."""
    rules, names = [], []
    for i, fn in enumerate(functions):
        rule = f"{prefix}_{i}"
        schema = bounded_json(call_schema(fn, args_key))
        rules.append(f"{rule}: %json {json.dumps(schema, ensure_ascii=False)}\n")
        names.append(rule)
    return "".join(rules), " | ".join(names)
