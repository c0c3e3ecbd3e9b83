"""JSON-schema grammars with bounded whitespace between JSON tokens.

llguidance's default lets any run of whitespace sit between tokens, so a model can emit newlines
forever. The pattern here is llama.cpp's (json-schema-to-grammar `space`): nothing, one space, or
one or two newlines and up to 20 indentation characters, so pretty-printed output still fits.
It is set as an override, so a schema's own "x-guidance" cannot unbound it.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance as llg

from edged.structured.errors import ConstraintError

WHITESPACE_PATTERN = r"(?:[ ]|\n{1,2}[ \t]{0,20})?"
MAX_WHITESPACE_RUN = 22  # the longest text WHITESPACE_PATTERN matches between two JSON tokens


def load_schema(value: Any, field: str) -> dict:
    """A JSON schema given as an object, a boolean or JSON text (vLLM's `json` may be a string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConstraintError(field, f"is not valid JSON: {e.msg} at position {e.pos}") from None
    if value is True:
        return {}
    if value is False:
        raise ConstraintError(field, "the schema `false` accepts no value")
    if not isinstance(value, dict):
        raise ConstraintError(field, f"must be a JSON schema object, not {type(value).__name__}")
    return value


def json_options(compact: bool = False, lenient: bool = False) -> dict:
    """llguidance JsonCompileOptions: bounded whitespace (none at all when `compact`)."""
    if compact:
        opts: dict = {"whitespace_flexible": False, "whitespace_pattern": None}
    else:
        opts = {"whitespace_flexible": False, "whitespace_pattern": WHITESPACE_PATTERN}
    if lenient:
        opts["lenient"] = True  # unimplemented keywords ignored instead of rejected
    return opts


def json_schema_grammar(schema: Any, field: str, *, compact: bool = False, lenient: bool = False) -> str:
    """The llguidance grammar of a JSON schema (not yet validated: see compile.check_grammar).

    Also the entry point for tool calling: a function's `parameters` schema, field naming it.
    """
    schema = load_schema(schema, field)
    try:
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=json_options(compact, lenient))
    except (ValueError, TypeError) as e:  # not serializable / not an object
        raise ConstraintError(field, f"is not a usable JSON schema: {e}") from None


def json_object_grammar(field: str = "response_format") -> str:
    """Any JSON object (OpenAI's `{"type": "json_object"}`), whitespace bounded."""
    return json_schema_grammar({"type": "object"}, field)
