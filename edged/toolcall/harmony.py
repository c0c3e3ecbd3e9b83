"""gpt-oss's harmony format: a reply is a sequence of messages, each on a channel,

    <|channel|>analysis<|message|>…<|end|>                                   reasoning
    <|start|>assistant<|channel|>final<|message|>…                           the answer
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{…}   (a call, either form)

The generation prompt ends with ``<|start|>assistant``, so the output begins with the first
message's header. ``<|end|>`` closes a message; the reply itself ends at ``<|return|>`` or, after a
call, ``<|call|>`` (end-of-generation tokens: not in the text). Commentary without a recipient
is a preamble to the user (content); so is a call to a function not in the request, or whose
arguments are not a JSON object, and a message to another recipient (the built-in browser and
python tools): their bodies stay content. Text that does not start with a header is all content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from edged.engine.output import held_suffix

from .base import ToolFormat
from .calls import RawCall, Scan
from .constraint import ConstraintSpec, TokenRef, Trigger, bounded_json, literal
from .jsonscan import INCOMPLETE, MALFORMED, is_json_object_text, value_end
from .reasoning import HARMONY_REASONING  # noqa: F401  (the reasoning spec this format pairs with)

START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
FUNCTIONS = "to=functions."
_BODY_ENDS = (END, CALL, RETURN, START)  # what closes a message body
_HEADER_STARTS = (CHANNEL, "to=", START, CONSTRAIN)  # what a header (after lstrip) begins with
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")


@dataclass
class _Message:
    header: str
    body: str
    closed: bool  # a terminator (or the end of a final text) ended the body


def _messages(text: str, final: bool) -> tuple[list[_Message], str | None]:
    """The complete-header messages of text, and the plain text (None: none) when the output does
    not follow the format. While streaming, a header without its <|message|> yet is held back."""
    out: list[_Message] = []
    pos = 0
    while pos < len(text):
        lead = text[pos:].lstrip()
        if not lead.startswith(_HEADER_STARTS):
            if not final and any(h.startswith(lead) for h in _HEADER_STARTS):
                break  # a header may still be arriving
            return out, text[pos:]  # not harmony from here on: plain content
        h_end = text.find(MESSAGE, pos)
        if h_end < 0:
            if final:
                return out, None  # a header the output ended inside of: nothing to show
            break
        body_at = h_end + len(MESSAGE)
        ends = [(i, t) for t in _BODY_ENDS if (i := text.find(t, body_at)) >= 0]
        if not ends:
            body = text[body_at:]
            if not final:
                body = body[:len(body) - held_suffix(body, _BODY_ENDS)]
            out.append(_Message(text[pos:h_end], body, final))
            break
        e, term = min(ends)
        out.append(_Message(text[pos:h_end], text[body_at:e], True))
        pos = e if term == START else e + len(term)
    return out, None


def _call(msg: _Message, names: frozenset[str] | None) -> RawCall | None:
    """The call a message makes (arguments so far while it streams), or None if it makes none."""
    m = _RECIPIENT.search(msg.header)
    if not m or not m.group(1).startswith("functions."):
        return None
    name = m.group(1)[len("functions."):]
    if not name or (names is not None and name not in names):
        return None
    args = msg.body.strip()
    if msg.closed:
        return RawCall(name, args) if is_json_object_text(args) else None
    end = value_end(args, 0) if args else INCOMPLETE
    if args and (args[0] != "{" or end == MALFORMED):
        return None
    return RawCall(name, args, complete=False)


def split_harmony(text: str, final: bool, names: frozenset[str] | None = None, calls: bool = True,
                  reasoning: bool = True) -> tuple[str | None, Scan]:
    """(reasoning or None, Scan(content, calls)) of a harmony reply. calls=False: no tools were
    offered, every message is text; reasoning=False: the analysis stays in the content."""
    msgs, plain = _messages(text, final)
    thoughts, parts, found = [], [], []
    for msg in msgs:
        channel = _CHANNEL_NAME.search(msg.header)
        call = _call(msg, names) if calls else None
        if call is not None:
            found.append(call)
        elif channel is not None and channel.group(1) == "analysis" and reasoning:
            thoughts.append(msg.body.strip())
        else:
            parts.append(msg.body.strip())
    if plain is not None:
        parts.append(plain.strip())
    content = "\n".join(p for p in parts if p)
    return ("\n".join(t for t in thoughts if t) if thoughts else None), Scan(content, found)


class HarmonyFormat(ToolFormat):
    """The harmony reply as content, reasoning (the analysis channel) and at most one call."""

    name = "harmony"
    triggers = (FUNCTIONS,)
    special_tokens = (START, END, MESSAGE, CHANNEL, CONSTRAIN)
    frames_reasoning = True

    def scan(self, text: str, final: bool, names: frozenset[str] | None = None) -> Scan:
        return split_harmony(text, final, names)[1]

    def constraint(self, request, token_ref: TokenRef | None = None) -> ConstraintSpec | None:
        """The call's header from ``to=functions.`` on, then its JSON arguments. Lazy under
        tool_choice auto (the trigger); otherwise from the first token, after an optional
        analysis message."""
        if not request.active:
            return None
        ch, msg, con = (literal(t, token_ref) for t in (CHANNEL, MESSAGE, CONSTRAIN))
        tail = (f'" " {con} "json" {msg} | {ch} "commentary" (" json" | " " {con} "json")? {msg} | {msg}')
        fns = list(request.selected())
        alts = " | ".join(f"fn_{i}" for i in range(len(fns)))
        rules = "".join(f"fn_{i}: {literal(f.name, None)} tail args_{i}\n"
                        f"args_{i}: %json {_dumps(bounded_json(f.parameters))}\n" for i, f in enumerate(fns))
        lazy = request.choice == "auto"
        if lazy:
            start = f'start: "{FUNCTIONS}" call\n'
        else:  # the reply may think first; the call's header starts on the commentary channel
            end, st = literal(END, token_ref), literal(START, token_ref)
            start = (f'start: analysis? ({ch} "commentary " | " ") "{FUNCTIONS}" call\n'
                     f'analysis: {ch} "analysis" {msg} THOUGHT {end} {st} "assistant"\n'
                     'THOUGHT: /(.|\\n)*/\n')
        lark = start + f"call: {alts}\ntail: {tail}\n" + rules
        return ConstraintSpec("lark", lark=lark, lazy=lazy, triggers=[Trigger(FUNCTIONS)] if lazy else [],
                              special_tokens=self.special_tokens)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)
