"""The output parser: reasoning split + tool-call scan, complete or fed as text deltas.

Streaming re-scans the whole text on each delta and emits what grew since the last scan; the
scanners only report what the final parse will also report, so the deltas reassemble to it.
"""

from __future__ import annotations

from .base import ToolFormat
from .calls import ParsedMessage, Scan, StreamDelta, ToolCall, ToolCallDelta
from .harmony import split_harmony
from .reasoning import HARMONY_REASONING, ReasoningSpec, split_reasoning
from .tools import ToolRequest


class OutputParser:
    """Parse one generated message. ``fmt``/``request``: the tool format and the validated
    request (no request, or tool_choice none: content only); ``reasoning``: the think tags to
    split on (None: no split); ``starts_in_reasoning``: the prompt left a think block open."""

    def __init__(self, fmt: ToolFormat | None = None, request: ToolRequest | None = None,
                 reasoning: ReasoningSpec | None = None, starts_in_reasoning: bool = False):
        active = fmt is not None and request is not None and request.active
        self.fmt = fmt if active else None
        # harmony: its channels carry reasoning, content and calls (with or without tools)
        self.channels = reasoning is HARMONY_REASONING or (fmt is not None and fmt.frames_reasoning)
        self.names = request.names if active else None
        self.reasoning = reasoning
        self.starts_in_reasoning = starts_in_reasoning and reasoning is not None
        self.text = ""
        self.diverged = False  # a streamed call turned out malformed (e.g. cut by max_tokens)
        self._reasoning = ""
        self._content = ""
        self._calls: list[list[str]] = []  # [id, name, arguments sent so far]

    def feed(self, delta: str) -> list[StreamDelta]:
        self.text += delta
        if self.diverged or not delta:
            return []
        return self._emit(*self._snapshot(final=False))

    def finish(self) -> tuple[list[StreamDelta], ParsedMessage]:
        """The last deltas and the whole message (ids as streamed)."""
        reasoning, scan = self._snapshot(final=True)
        deltas = [] if self.diverged else self._emit(reasoning, scan)
        calls = []
        for i, c in enumerate(scan.calls):
            streamed = i < len(self._calls) and not self.diverged
            calls.append(ToolCall(self._calls[i][0] if streamed else self._new_id(),
                                  c.name, c.arguments))
        return deltas, ParsedMessage(scan.content, calls, reasoning)

    def parse(self, text: str) -> ParsedMessage:
        """The non-streaming path: the whole output at once."""
        self.text = text
        return self.finish()[1]

    def _new_id(self) -> str:
        return self.fmt.new_id() if self.fmt is not None else ""

    def _snapshot(self, final: bool) -> tuple[str | None, Scan]:
        if self.channels:
            return split_harmony(self.text, final, self.names, calls=self.fmt is not None,
                                 reasoning=self.reasoning is not None)
        reasoning, rest = None, self.text
        if self.reasoning is not None:
            reasoning, rest = split_reasoning(self.text, self.reasoning,
                                              self.starts_in_reasoning, final)
        if self.fmt is None:
            return reasoning, Scan(rest.lstrip() if reasoning is not None else rest)
        return reasoning, self.fmt.scan(rest, final, self.names)

    def _emit(self, reasoning: str | None, scan: Scan) -> list[StreamDelta]:
        out: list[StreamDelta] = []
        grown = _grown(self._reasoning, reasoning or "")
        grown_content = _grown(self._content, scan.content)
        if grown is None or grown_content is None or len(scan.calls) < len(self._calls):
            self.diverged = True
            return out
        if grown:
            out.append(StreamDelta(reasoning_content=grown))
            self._reasoning = reasoning
        if grown_content:
            out.append(StreamDelta(content=grown_content))
            self._content = scan.content
        for i, call in enumerate(scan.calls):
            if i == len(self._calls):
                self._calls.append([self._new_id(), call.name, call.arguments])
                out.append(StreamDelta(tool_call=ToolCallDelta(
                    i, call.arguments, id=self._calls[i][0], name=call.name)))
                continue
            _, name, sent = self._calls[i]
            frag = _grown(sent, call.arguments)
            if frag is None or name != call.name:
                self.diverged = True
                break
            if frag:
                self._calls[i][2] = call.arguments
                out.append(StreamDelta(tool_call=ToolCallDelta(i, frag)))
        return out


def _grown(sent: str, now: str) -> str | None:
    """What ``now`` adds to ``sent``; None when it does not extend it."""
    return now[len(sent):] if now.startswith(sent) else None


def parse_output(text: str, fmt: ToolFormat | None = None, request: ToolRequest | None = None,
                 reasoning: ReasoningSpec | None = None,
                 starts_in_reasoning: bool = False) -> ParsedMessage:
    return OutputParser(fmt, request, reasoning, starts_in_reasoning).parse(text)
