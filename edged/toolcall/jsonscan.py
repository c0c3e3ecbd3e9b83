"""Prefix-aware JSON scanning: where a JSON value ends, whether a prefix can still become one.

Streaming needs to tell "not finished yet" (wait for more text) from "can never be valid" (it is
content), which ``json.loads`` does not, so values are bracket-matched first and decoded after.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .calls import RawCall

INCOMPLETE = -1
MALFORMED = -2

_DECODER = json.JSONDecoder(strict=False)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
# A complete string, a bracket, or a lone quote (an unterminated string).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]]|"', re.S)
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_WS = re.compile(r"[ \t\r\n]*")
_CLOSE = {"{": "}", "[": "]"}
# An unescaped trailing backslash, partial \u escape, or lone high surrogate (group 2).
_TAIL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)(\\u[dD][89abAB][0-9a-fA-F]{2}|\\u[0-9a-fA-F]{0,3}|\\)$")


def skip_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()


def loads(text: str):
    return _DECODER.decode(text)


def string_end(text: str, pos: int) -> int:
    """End of the JSON string starting at ``pos`` (a quote), or INCOMPLETE."""
    m = _STRING.match(text, pos)
    return m.end() if m else INCOMPLETE


def value_end(text: str, pos: int) -> int:
    """End of the JSON value starting at ``pos``, INCOMPLETE (text ran out) or MALFORMED."""
    if pos >= len(text):
        return INCOMPLETE
    ch = text[pos]
    if ch == '"':
        return string_end(text, pos)
    if ch in _CLOSE:
        return _container_end(text, pos)
    m = _SCALAR.match(text, pos)
    if m and m.end() < len(text):
        return m.end()
    rest = text[pos:]
    if m or any(word.startswith(rest) for word in ("true", "false", "null")) or rest == "-":
        return INCOMPLETE  # a number or literal that the next text may still extend
    return MALFORMED


def _container_end(text: str, pos: int) -> int:
    stack: list[str] = []
    i = pos
    while True:
        m = _TOKEN.search(text, i)
        if m is None:
            return INCOMPLETE
        tok = m.group()
        if tok == '"':
            return INCOMPLETE
        i = m.end()
        if tok in _CLOSE:
            stack.append(_CLOSE[tok])
        elif tok[0] != '"':
            if not stack or stack.pop() != tok:
                return MALFORMED
            if not stack:
                try:
                    loads(text[pos:i])
                except ValueError:
                    return MALFORMED
                return i


def decode_partial_string(text: str, pos: int) -> tuple[str, bool]:
    """Decode the JSON string at ``pos``; if unterminated, the longest safely decodable prefix."""
    end = string_end(text, pos)
    if end != INCOMPLETE:
        return loads(text[pos:end]), True
    body = text[pos + 1:]
    # Drop a trailing escape that is not whole yet, or a high surrogate still awaiting its pair.
    for _ in range(2):
        m = _TAIL_ESCAPE.search(body)
        if m:
            body = body[:m.start(2)]
    try:
        return loads('"' + body + '"'), False
    except ValueError:
        return "", False


def is_json_object_text(text: str) -> bool:
    try:
        return isinstance(loads(text), dict)
    except ValueError:
        return False


DONE, PARTIAL, NOT_CALL, BAD = "done", "partial", "not_call", "bad"


@dataclass
class Block:
    """One scanned call region: DONE (calls, end), PARTIAL (text ran out), NOT_CALL or BAD."""
    status: str
    calls: list[RawCall] = field(default_factory=list)
    end: int = 0


@dataclass
class _ObjState:
    name: str | None = None
    args: str | None = None
    args_at: int = -1
    committed: bool = False


def match_call_object(text: str, pos: int, args_keys: tuple[str, ...],
                      names: frozenset[str] | None) -> Block:
    """Match ``{"name": …, "arguments": …, …}`` at ``pos`` (a ``{``), keys in any order.

    The call is committed (reported while still incomplete) once its name is known and its
    arguments object has begun; before that an incomplete prefix is PARTIAL with no call.
    """
    st = _ObjState()
    i = skip_ws(text, pos + 1)
    while True:
        if i >= len(text):
            return _partial(st, text)
        if text[i] == "}":
            return _finish_object(st, i + 1)
        kend = string_end(text, i) if text[i] == '"' else MALFORMED
        if kend < 0:
            return _partial(st, text) if kend == INCOMPLETE else _reject(st)
        key = loads(text[i:kend])
        i = skip_ws(text, kend)
        if i >= len(text):
            return _partial(st, text)
        if text[i] != ":":
            return _reject(st)
        i = skip_ws(text, i + 1)
        vend = value_end(text, i)
        if vend == MALFORMED:
            return _reject(st)
        if key == "name" and st.name is None:
            if i < len(text) and text[i] != '"':
                return _reject(st)
            if vend == INCOMPLETE:
                return _partial(st, text)
            st.name = loads(text[i:vend])
            if not isinstance(st.name, str) or (names is not None and st.name not in names):
                return Block(NOT_CALL)
        elif key in args_keys and st.args_at < 0:
            st.args_at = i
            bad = _take_args(st, text, i, vend)
            if bad is not None:
                return bad
        elif vend == INCOMPLETE:
            return _partial(st, text)
        i = skip_ws(text, vend)
        if i >= len(text):
            return _partial(st, text)
        if text[i] == ",":
            i = skip_ws(text, i + 1)
        elif text[i] != "}":
            return _reject(st)


def _take_args(st: _ObjState, text: str, i: int, vend: int) -> Block | None:
    """Record the arguments value at ``i``; a Block when scanning must stop there."""
    if i >= len(text):
        return _partial(st, text)
    if text[i] == "{":
        st.committed = st.name is not None
        if vend == INCOMPLETE:
            return _partial(st, text)
        st.args = text[i:vend]
        return None
    if text[i] == '"':  # arguments given as a JSON string holding the object
        if vend == INCOMPLETE:
            return _partial(st, text)
        inner = loads(text[i:vend])
        if not is_json_object_text(inner):
            return _reject(st)
        st.args, st.committed = inner, st.name is not None
        return None
    return _reject(st)


def _partial(st: _ObjState, text: str) -> Block:
    if not st.committed:
        return Block(PARTIAL)
    args = st.args if st.args is not None else text[st.args_at:]
    return Block(PARTIAL, [RawCall(st.name, args, complete=False)])


def _reject(st: _ObjState) -> Block:
    return Block(BAD if st.committed else NOT_CALL)


def _finish_object(st: _ObjState, end: int) -> Block:
    if st.name is None or st.args is None:
        return _reject(st)
    return Block(DONE, [RawCall(st.name, st.args)], end)


def match_call_array(text: str, i: int, args_keys: tuple[str, ...], names,
                     final: bool) -> Block:
    """Match ``[call, call, …]`` at ``i`` (a ``[``); an unclosed array is accepted when final."""
    calls: list[RawCall] = []
    i = skip_ws(text, i + 1)
    while True:
        if i >= len(text):
            return Block(PARTIAL, calls)
        if text[i] != "{":
            return Block(BAD if calls else NOT_CALL)
        block = match_call_object(text, i, args_keys, names)
        if block.status != DONE:
            if block.status == NOT_CALL and calls:
                return Block(BAD)
            return Block(block.status, calls + block.calls)
        calls.extend(block.calls)
        i = skip_ws(text, block.end)
        if i >= len(text):
            return Block(DONE, calls, i) if final else Block(PARTIAL, calls)
        if text[i] == "]":
            return Block(DONE, calls, i + 1)
        if text[i] != ",":
            return Block(BAD)
        i = skip_ws(text, i + 1)
