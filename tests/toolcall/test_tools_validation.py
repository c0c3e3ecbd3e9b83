"""Request validation: each bad input raises ToolError naming the field."""

import pytest

from edged.toolcall import ToolError, parse_tool_request

from tests.toolcall.streamcheck import SEARCH, WEATHER


def fn(**function):
    return {"type": "function", "function": function}


@pytest.mark.parametrize("tools, choice, parallel, field", [
    ("nope", None, None, "tools"),
    ([42], None, None, "tools[0]"),
    ([{"type": "retrieval"}], None, None, "tools[0].type"),
    ([{"type": "function"}], None, None, "tools[0].function"),
    ([fn(parameters={"type": "object"})], None, None, "tools[0].function.name"),
    ([WEATHER, fn(name="")], None, None, "tools[1].function.name"),
    ([fn(name="has space")], None, None, "tools[0].function.name"),
    ([WEATHER, WEATHER], None, None, "tools[1].function.name"),
    ([fn(name="f", parameters=[1])], None, None, "tools[0].function.parameters"),
    ([fn(name="f", parameters={"type": "string"})], None, None, "tools[0].function.parameters"),
    ([fn(name="f", description=3)], None, None, "tools[0].function.description"),
    ([WEATHER], "sometimes", None, "tool_choice"),
    ([WEATHER], 7, None, "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "search"}}, None,
     "tool_choice.function.name"),
    ([WEATHER], {"type": "function", "function": {}}, None, "tool_choice.function.name"),
    ([WEATHER], {"type": "tool"}, None, "tool_choice"),
    (None, "required", None, "tool_choice"),
    ([WEATHER], "auto", "yes", "parallel_tool_calls"),
])
def test_errors_name_the_field(tools, choice, parallel, field):
    with pytest.raises(ToolError) as err:
        parse_tool_request(tools, choice, parallel)
    assert err.value.field == field and field in str(err.value)


def test_valid_requests():
    req = parse_tool_request([WEATHER, SEARCH])
    assert req.choice == "auto" and req.parallel and req.active and req.max_calls is None
    assert req.names == {"get_weather", "search"}
    req = parse_tool_request([WEATHER, SEARCH], {"type": "function", "function": {"name": "search"}},
                             False)
    assert req.choice == "function" and [f.name for f in req.selected()] == ["search"]
    assert req.max_calls == 1
    assert not parse_tool_request(None).active and parse_tool_request([]).choice == "none"
    assert not parse_tool_request([WEATHER], "none").active
    req = parse_tool_request([fn(name="noargs")], "required")
    assert req.functions[0].parameters == {"type": "object", "properties": {}}
