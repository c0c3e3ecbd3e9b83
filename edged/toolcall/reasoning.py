"""``<think>…</think>`` reasoning: detection from the template, and the split of an output."""

from __future__ import annotations

from dataclasses import dataclass

from edged.engine.output import held_suffix


@dataclass(frozen=True)
class ReasoningSpec:
    start: str = "<think>"
    end: str = "</think>"


THINK = ReasoningSpec()
# gpt-oss's harmony reply (edged/toolcall/harmony.py): the analysis channel is the reasoning, and
# it is over once the final channel's header has been written (a response_format grammar starts there)
HARMONY_REASONING = ReasoningSpec(start="<|channel|>analysis<|message|>", end="<|channel|>final<|message|>")


def detect_reasoning(template: str | None) -> ReasoningSpec | None:
    """Qwen 3, QwQ and the DeepSeek-R1 distills write ``</think>`` in their templates; gpt-oss's
    (harmony) writes ``<|channel|>``."""
    if template and "<|channel|>" in template:
        return HARMONY_REASONING
    if template and THINK.end in template:
        return THINK
    return None


def reasoning_spec(template: str | None, reasoning_format: str = "auto") -> ReasoningSpec | None:
    """The spec to split with under ``--reasoning-format`` ``none`` (never) or ``auto``."""
    if reasoning_format not in ("none", "auto"):
        raise ValueError(f"reasoning_format must be 'none' or 'auto', not {reasoning_format!r}")
    return detect_reasoning(template) if reasoning_format == "auto" else None


def opens_in_reasoning(prompt: str, spec: ReasoningSpec | None) -> bool:
    """Whether the rendered prompt (its generation prompt) leaves a thinking block open, as
    Qwen 3 with thinking on and the newer DeepSeek-R1 templates do."""
    if spec is None:
        return False
    if spec is HARMONY_REASONING:  # the reply always opens with headers, before any final answer
        return True
    return prompt.rfind(spec.start) > prompt.rfind(spec.end)


def split_reasoning(text: str, spec: ReasoningSpec, starts_inside: bool,
                    final: bool) -> tuple[str | None, str]:
    """(reasoning or None, the text after it). Streaming (``final=False``) holds back what may
    still become a tag; an unclosed block is all reasoning (the output ended while thinking)."""
    body_at = 0
    if not starts_inside:
        lead = text.lstrip()
        if lead.startswith(spec.start):
            body_at = len(text) - len(lead) + len(spec.start)
        elif not final and spec.start.startswith(lead):
            return None, ""
        else:
            return None, text
    end = text.find(spec.end, body_at)
    if end < 0:
        body = text[body_at:]
        if not final:
            body = body[:len(body) - held_suffix(body, (spec.end,))]
        return body.strip(), ""
    return text[body_at:end].strip(), text[end + len(spec.end):]
