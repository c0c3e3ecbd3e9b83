"""Every bad constraint gives ConstraintError naming the request field (the server's 400)."""

import llguidance as llg
import pytest

from edged.structured import ConstraintError, check_constraint, constraint_from_request, new_matcher
from edged.structured.forms import schema_constraint

RF = "response_format"


def _js(schema):
    return {RF: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


BAD = [
    ({RF: "json"}, RF),
    ({RF: {"type": "xml"}}, f"{RF}.type"),
    ({RF: {"type": "json_schema"}}, f"{RF}.json_schema"),
    ({RF: {"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}}, f"{RF}.json_schema.name"),
    ({RF: {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}}, f"{RF}.json_schema.strict"),
    (_js({"type": "strin"}), f"{RF}.json_schema.schema"),  # malformed
    (_js({"not": {"type": "string"}}), f"{RF}.json_schema.schema"),  # unsupported keyword
    (_js({"type": "string", "format": "bogus"}), f"{RF}.json_schema.schema"),
    (_js({"type": "string", "pattern": "(("}), f"{RF}.json_schema.schema"),
    (_js({"$ref": "#/$defs/missing"}), f"{RF}.json_schema.schema"),
    (_js({"type": "array", "minItems": 3, "maxItems": 1}), f"{RF}.json_schema.schema"),  # unsatisfiable
    (_js([1, 2]), f"{RF}.json_schema.schema"),
    (_js(False), f"{RF}.json_schema.schema"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"json_schema": {"type": "integer", "minimum": "x"}}, "json_schema"),
    ({"grammar": "root ::= foo"}, "grammar"),  # undefined rule (GBNF conversion)
    ({"grammar": 'root ::= "a'}, "grammar"),  # unterminated literal
    ({"grammar": "start: foo"}, "grammar"),  # Lark, undefined rule (compile)
    ({"grammar": 42}, "grammar"),
    ({"structured_outputs": {"regex": "a("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", 3]}}, "structured_outputs.choice[1]"),
    ({"structured_outputs": {"choice": "a"}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice"),  # two forms
    ({"structured_outputs": {"foo": 1}}, "structured_outputs.foo"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": []}, "structured_outputs"),
    ({RF: {"type": "json_object"}, "json_schema": {}}, "json_schema"),  # two constraints
    ({"grammar": 'root ::= "a"', "guided_regex": "b"}, "guided_regex"),
]


@pytest.mark.parametrize("body,field", BAD, ids=[f"{i}:{f}" for i, (_, f) in enumerate(BAD)])
def test_bad_input_names_field(tiny_bpe, body, field):
    with pytest.raises(ConstraintError) as ei:
        new_matcher(constraint_from_request(body), tiny_bpe.ll)
    assert ei.value.field == field
    assert ei.value.message and str(ei.value).startswith(field)


@pytest.mark.parametrize("body,field", [b for b in BAD if "json_schema.schema" in b[1] or b[1] == "grammar"][:6])
def test_check_without_tokenizer(body, field):
    """The same errors without a tokenizer (validating a request before the model is loaded)."""
    with pytest.raises(ConstraintError) as ei:
        check_constraint(constraint_from_request(body))
    assert ei.value.field == field


def test_limits_exceeded(tiny_bpe):
    c = schema_constraint({"enum": [f"value number {i}" for i in range(200)]}, "tools[0].function.parameters")
    new_matcher(c, tiny_bpe.ll)  # fits the default limits
    small = llg.LLParserLimits(initial_lexer_fuel=1000, verbose_errors=False)
    with pytest.raises(ConstraintError) as ei:
        new_matcher(c, tiny_bpe.ll, limits=small)
    assert ei.value.field == "tools[0].function.parameters"
    assert "too big" in ei.value.message
    with pytest.raises(ConstraintError):
        check_constraint(c, tiny_bpe.ll, limits=small)


def test_lenient_ignores_unsupported_keyword(tiny_bpe):
    c = schema_constraint({"type": "string", "not": {"const": "x"}}, "json_schema", lenient=True)
    assert not new_matcher(c, tiny_bpe.ll).is_error()
