"""Request fields -> one llguidance grammar (pure: no tokenizer, nothing compiled yet).

Accepted forms, at most one per request:
  OpenAI      response_format {"type": "json_object"} | {"type": "json_schema", "json_schema":
              {name, schema, strict}} ({"type": "text"} is no constraint)
  llama-server json_schema (a schema), grammar (GBNF, or Lark when it looks like Lark)
  vLLM        structured_outputs {json | regex | choice | grammar | json_object}, and the older
              guided_json / guided_regex / guided_choice / guided_grammar fields
A malformed value raises ConstraintError naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import llguidance as llg

from edged.structured.errors import ConstraintError
from edged.structured.json_grammar import json_object_grammar, json_schema_grammar


@dataclass(frozen=True)
class Constraint:
    """A grammar for llguidance plus where it came from (for error messages)."""

    grammar: str  # llguidance grammar text (LLMatcher input)
    field: str  # request field it was read from, dotted
    kind: str  # "json_object" | "json_schema" | "regex" | "choice" | "grammar"


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ConstraintError(field, f"must be a string, not {type(value).__name__}")
    if not value.strip():
        raise ConstraintError(field, "must not be empty")
    return value


def schema_constraint(schema: Any, field: str, *, lenient: bool = False, compact: bool = False) -> Constraint:
    """A JSON schema (object, boolean or JSON text) as a constraint; tool calling uses this too."""
    return Constraint(json_schema_grammar(schema, field, lenient=lenient, compact=compact), field, "json_schema")


def regex_constraint(regex: Any, field: str) -> Constraint:
    """The whole output matches `regex` (Rust regex syntax, as vLLM's guidance backend)."""
    return Constraint(llg.LLMatcher.grammar_from_regex(_string(regex, field)), field, "regex")


def choice_constraint(choices: Any, field: str) -> Constraint:
    """The output is exactly one of `choices` (a non-empty list of non-empty strings)."""
    if not isinstance(choices, list) or not choices:
        raise ConstraintError(field, "must be a non-empty list of strings")
    for i, c in enumerate(choices):
        if not isinstance(c, str) or not c:
            raise ConstraintError(f"{field}[{i}]", "must be a non-empty string")
    # JSON string escapes are valid Lark string literals
    lark = "start: " + " | ".join(json.dumps(c) for c in choices)
    return Constraint(llg.LLMatcher.grammar_from_lark(lark), field, "choice")


def grammar_constraint(text: Any, field: str) -> Constraint:
    """A GBNF grammar (llama.cpp, root rule `root`) or a Lark grammar (llguidance, rule `start`)."""
    try:
        grammar = llg.grammar_from("gbnf", _string(text, field))
    except ValueError as e:
        raise ConstraintError(field, f"is not a valid GBNF grammar: {e}") from None
    return Constraint(grammar, field, "grammar")


def response_format_constraint(rf: Any, field: str = "response_format") -> Constraint | None:
    """OpenAI's response_format; None for {"type": "text"}."""
    if not isinstance(rf, Mapping):
        raise ConstraintError(field, "must be an object")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        if rf.get("schema") is not None:  # llama-server's extension: json_object with a schema
            return schema_constraint(rf["schema"], f"{field}.schema")
        return Constraint(json_object_grammar(field), field, "json_object")
    if kind == "json_schema":
        js = rf.get("json_schema")
        sub = f"{field}.json_schema"
        if not isinstance(js, Mapping):
            raise ConstraintError(sub, "must be an object with `name` and `schema`")
        if "name" in js and not isinstance(js["name"], str):
            raise ConstraintError(f"{sub}.name", "must be a string")
        if "strict" in js and js["strict"] is not None and not isinstance(js["strict"], bool):
            raise ConstraintError(f"{sub}.strict", "must be a boolean")
        if js.get("schema") is None:  # OpenAI: schema is optional; then any JSON object
            return Constraint(json_object_grammar(sub), sub, "json_object")
        return schema_constraint(js["schema"], f"{sub}.schema")
    raise ConstraintError(f"{field}.type", f"must be 'text', 'json_object' or 'json_schema', not {kind!r}")


_SO_FORMS = ("json", "regex", "choice", "grammar", "json_object")
# vLLM options with no effect here (whitespace stays bounded; llguidance is the only backend)
_SO_IGNORED = ("backend", "disable_fallback", "disable_any_whitespace", "disable_additional_properties",
               "whitespace_pattern", "structural_tag")


def structured_outputs_constraint(so: Any, field: str = "structured_outputs") -> Constraint | None:
    """vLLM's structured_outputs object: exactly one of json, regex, choice, grammar, json_object."""
    if not isinstance(so, Mapping):
        raise ConstraintError(field, "must be an object")
    unknown = [k for k in so if k not in _SO_FORMS and k not in _SO_IGNORED]
    if unknown:
        raise ConstraintError(f"{field}.{unknown[0]}", "is not a supported structured_outputs key")
    if so.get("structural_tag") is not None:
        raise ConstraintError(f"{field}.structural_tag", "is not supported")
    given = [k for k in _SO_FORMS if so.get(k) not in (None, False)]
    if len(given) > 1:
        raise ConstraintError(f"{field}.{given[1]}", f"conflicts with {field}.{given[0]}: give one")
    if not given:
        return None
    key = given[0]
    sub, value = f"{field}.{key}", so[key]
    compact = so.get("disable_any_whitespace") is True
    if key == "json":
        return schema_constraint(value, sub, compact=compact)
    if key == "json_object":
        if value is not True:
            raise ConstraintError(sub, "must be true")
        return schema_constraint({"type": "object"}, sub, compact=compact)
    return {"regex": regex_constraint, "choice": choice_constraint, "grammar": grammar_constraint}[key](value, sub)


def _legacy(key: str, value: Any) -> Constraint:
    if key == "guided_json":
        return schema_constraint(value, key)
    return {"guided_regex": regex_constraint, "guided_choice": choice_constraint,
            "guided_grammar": grammar_constraint}[key](value, key)


_TOP_FIELDS = ("response_format", "json_schema", "grammar", "structured_outputs",
               "guided_json", "guided_regex", "guided_choice", "guided_grammar")


def constraint_from_request(body: Mapping) -> Constraint | None:
    """The request's constraint, from whichever single form it uses; None when unconstrained."""
    found: list[tuple[str, Constraint]] = []
    for key in _TOP_FIELDS:
        value = body.get(key)
        if value is None:
            continue
        if key == "response_format":
            c = response_format_constraint(value)
        elif key == "json_schema":
            c = schema_constraint(value, key)
        elif key == "grammar":
            c = None if value == "" else grammar_constraint(value, key)  # llama-server: "" = none
        elif key == "structured_outputs":
            c = structured_outputs_constraint(value)
        else:
            c = _legacy(key, value)
        if c is not None:
            found.append((key, c))
    if len(found) > 1:
        raise ConstraintError(found[1][0], f"conflicts with {found[0][0]}: give one constraint")
    return found[0][1] if found else None
