"""Value types shared by every tool-call format: calls, parse results, stream deltas, errors."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field

_ALNUM = string.ascii_letters + string.digits


class ToolError(ValueError):
    """A bad ``tools`` / ``tool_choice`` request; ``field`` names the offending request field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def random_alnum(n: int) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def openai_call_id() -> str:
    """``call_`` + 24 alphanumerics, the shape OpenAI's ids have."""
    return "call_" + random_alnum(24)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # the arguments as a JSON text (an object), as OpenAI's function.arguments

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class RawCall:
    """A call as a scanner sees it: the id is assigned later (stream layer or parse())."""
    name: str
    arguments: str
    complete: bool = True


@dataclass
class Scan:
    """What a format's scanner found in a text: the text outside calls, and the calls.

    With ``final=False`` the content is only what is certainly content (a possible trigger
    is held back) and the last call may be incomplete (its arguments a prefix of the final ones).
    """
    content: str = ""
    calls: list[RawCall] = field(default_factory=list)


@dataclass
class ParsedMessage:
    content: str
    tool_calls: list[ToolCall]
    reasoning_content: str | None = None

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    def to_openai(self) -> dict:
        msg: dict = {"role": "assistant", "content": self.content or None}
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg


@dataclass
class ToolCallDelta:
    """One entry of OpenAI's streaming ``delta.tool_calls``: id/type/name only on the first."""
    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict:
        out: dict = {"index": self.index}
        fn: dict = {}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
            fn["name"] = self.name
        fn["arguments"] = self.arguments
        out["function"] = fn
        return out


@dataclass
class StreamDelta:
    """One streamed piece: exactly one of the three fields is set."""
    content: str | None = None
    reasoning_content: str | None = None
    tool_call: ToolCallDelta | None = None

    def to_openai(self) -> dict:
        if self.tool_call is not None:
            return {"tool_calls": [self.tool_call.to_openai()]}
        if self.reasoning_content is not None:
            return {"reasoning_content": self.reasoning_content}
        return {"content": self.content}
