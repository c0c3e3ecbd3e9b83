"""Validation of a chat request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .calls import ToolError

# OpenAI's function-name rule, plus "." which some clients use for namespaced tools.
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_EMPTY_PARAMS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict
    description: str | None = None


@dataclass(frozen=True)
class ToolRequest:
    functions: tuple[Function, ...]
    choice: str  # "auto" | "none" | "required" | "function" (a named one: ``forced``)
    forced: str | None = None
    parallel: bool = True

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.functions)

    @property
    def active(self) -> bool:
        """Whether the output is parsed for calls at all."""
        return self.choice != "none" and bool(self.functions)

    def selected(self) -> tuple[Function, ...]:
        """The functions a constrained call may name."""
        if self.forced is not None:
            return tuple(f for f in self.functions if f.name == self.forced)
        return self.functions

    @property
    def max_calls(self) -> int | None:
        """1 without parallel calls or with a named tool_choice (OpenAI answers that one call)."""
        return 1 if not self.parallel or self.forced is not None else None


def parse_tool_request(tools, tool_choice=None, parallel_tool_calls=None) -> ToolRequest:
    """Validate the request fields; raises :class:`ToolError` naming the field."""
    functions = _parse_tools(tools)
    if parallel_tool_calls is None:
        parallel = True
    elif isinstance(parallel_tool_calls, bool):
        parallel = parallel_tool_calls
    else:
        raise ToolError("parallel_tool_calls", "must be a boolean")
    choice, forced = _parse_choice(tool_choice, {f.name for f in functions})
    return ToolRequest(functions, choice, forced, parallel)


def _parse_tools(tools) -> tuple[Function, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ToolError("tools", "must be an array of tools")
    out: list[Function] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ToolError(where, "must be an object")
        if tool.get("type", "function") != "function":
            raise ToolError(f"{where}.type", f"unsupported tool type {tool.get('type')!r}; "
                            "only 'function' is supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise ToolError(f"{where}.function", "must be an object with a name")
        out.append(_parse_function(fn, f"{where}.function", seen))
    return tuple(out)


def _parse_function(fn: dict, where: str, seen: set[str]) -> Function:
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError(f"{where}.name", "is required (a non-empty string)")
    if not _NAME.match(name):
        raise ToolError(f"{where}.name", f"{name!r} must be 1-64 of a-z, A-Z, 0-9, '_', '-', '.'")
    if name in seen:
        raise ToolError(f"{where}.name", f"duplicate function name {name!r}")
    seen.add(name)
    params = fn.get("parameters")
    if params is None:
        params = dict(_EMPTY_PARAMS)
    elif not isinstance(params, dict):
        raise ToolError(f"{where}.parameters", "must be a JSON Schema object")
    elif params.get("type", "object") != "object":
        raise ToolError(f"{where}.parameters", "must describe an object (\"type\": \"object\")")
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise ToolError(f"{where}.description", "must be a string")
    return Function(name, params, desc)


def _parse_choice(choice, names: set[str]) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if names else "none"), None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise ToolError("tool_choice", f"unknown value {choice!r}; expected 'auto', 'none', "
                            "'required' or {\"type\": \"function\", \"function\": {\"name\": …}}")
        if choice == "required" and not names:
            raise ToolError("tool_choice", "'required' needs a non-empty 'tools'")
        return choice, None
    if not isinstance(choice, dict) or choice.get("type") != "function":
        raise ToolError("tool_choice", "must be a string or {\"type\": \"function\", …}")
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise ToolError("tool_choice.function.name", "is required")
    if name not in names:
        raise ToolError("tool_choice.function.name", f"{name!r} is not a function in 'tools'")
    return "function", name
