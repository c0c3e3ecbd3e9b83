"""The interface every tool-call format implements, and the trigger-driven scan they share."""

from __future__ import annotations

from edged.engine.output import held_suffix

from .calls import RawCall, Scan, ToolCall, openai_call_id
from .jsonscan import DONE, NOT_CALL, PARTIAL, Block


class ToolFormat:
    """One tool-call syntax. Subclasses set ``name``/``triggers`` and implement ``parse_block``
    (or override ``scan`` whole, as the generic format does) and ``constraint``."""

    name = "base"
    triggers: tuple[str, ...] = ()
    # Literals of the format that are single (special) tokens in the models that use it.
    special_tokens: tuple[str, ...] = ()
    # The format's own headers frame reasoning, content and calls (harmony): its output is split
    # by it alone, and a tools grammar starts at its trigger, not after the reasoning.
    frames_reasoning = False

    def new_id(self) -> str:
        return openai_call_id()

    def parse_block(self, text: str, start: int, trigger: str,
                    names: frozenset[str] | None, final: bool) -> Block:
        raise NotImplementedError

    def scan(self, text: str, final: bool, names: frozenset[str] | None = None) -> Scan:
        """Content outside calls (stripped) and calls; see :class:`Scan` for ``final=False``."""
        parts: list[str] = []
        calls: list[RawCall] = []
        pos = 0
        while True:
            start, trig = _first_trigger(text, pos, self.triggers)
            if start < 0:
                tail = text[pos:]
                if not final:
                    tail = tail[:len(tail) - held_suffix(tail, self.triggers)]
                parts.append(tail)
                break
            parts.append(text[pos:start])
            block = self.parse_block(text, start, trig, names, final)
            if block.status == DONE:
                calls.extend(block.calls)
                pos = block.end
            elif block.status == NOT_CALL:
                parts.append(trig)
                pos = start + len(trig)
            elif block.status == PARTIAL and not final:
                calls.extend(block.calls)  # the rest is held back until it is decided
                break
            else:  # BAD, or a call the text ended inside of: it stays text
                parts.append(text[start:])
                break
        return Scan("".join(parts).strip(), calls)

    def parse(self, text: str, names: frozenset[str] | None = None) -> tuple[str, list[ToolCall]]:
        """Content and tool calls of a complete output; a malformed call stays content."""
        scan = self.scan(text, True, names)
        return scan.content, [ToolCall(self.new_id(), c.name, c.arguments) for c in scan.calls]

    def constraint(self, request):
        """The :class:`~edged.toolcall.constraint.ConstraintSpec` for a ToolRequest, or None."""
        raise NotImplementedError


def _first_trigger(text: str, pos: int, triggers: tuple[str, ...]) -> tuple[int, str]:
    best, best_trig = -1, ""
    for trig in triggers:
        i = text.find(trig, pos)
        if i >= 0 and (best < 0 or i < best):
            best, best_trig = i, trig
    return best, best_trig


def block_status_done(block: Block, final: bool) -> Block:
    """A call whose closing text has not arrived: PARTIAL while streaming, accepted when final."""
    return Block(DONE, block.calls, block.end) if final else Block(PARTIAL, block.calls)

