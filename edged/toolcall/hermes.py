"""Hermes 2/3 Pro, Qwen 2.5 and Qwen 3: ``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``."""

from __future__ import annotations

from .base import ToolFormat, block_status_done
from .constraint import ConstraintSpec, TokenRef, Trigger, json_rules, lark_repeat, literal
from .jsonscan import BAD, DONE, NOT_CALL, PARTIAL, Block, match_call_object, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat(ToolFormat):
    name = "hermes"
    triggers = (OPEN,)
    special_tokens = (OPEN, CLOSE)

    def parse_block(self, text, start, trigger, names, final) -> Block:
        i = skip_ws(text, start + len(OPEN))
        if i >= len(text):
            return Block(PARTIAL)
        if text[i] != "{":
            return Block(NOT_CALL)
        block = match_call_object(text, i, ("arguments", "parameters"), names)
        if block.status != DONE:
            return block
        j = skip_ws(text, block.end)
        if text.startswith(CLOSE, j):
            return Block(DONE, block.calls, j + len(CLOSE))
        if CLOSE.startswith(text[j:]):  # the closing tag has not (all) arrived yet
            return block_status_done(Block(DONE, block.calls, len(text)), final)
        return Block(BAD)

    def constraint(self, request, token_ref: TokenRef | None = None) -> ConstraintSpec | None:
        if not request.active:
            return None
        rules, alts = json_rules(request.selected(), "arguments")
        call = f"{literal(OPEN, token_ref)} \"\\n\" body \"\\n\" {literal(CLOSE, token_ref)}"
        lark = (lark_repeat("start", "call", "\n", request.max_calls)
                + f"call: {call}\nbody: {alts}\n" + rules)
        lazy = request.choice == "auto"
        return ConstraintSpec("lark", lark=lark, lazy=lazy,
                              triggers=[Trigger(OPEN)] if lazy else [],
                              special_tokens=self.special_tokens)
