"""Choose the tool-call format from the chat template's text, as llama.cpp's common/chat does."""

from __future__ import annotations

from .base import ToolFormat
from .generic import GenericFormat
from .harmony import HarmonyFormat
from .hermes import HermesFormat
from .llama3 import PYTHON_TAG, Llama3Format
from .mistral import ARGS, TOOL_CALLS, MistralFormat

HERMES = HermesFormat()
LLAMA3 = Llama3Format()
MISTRAL = MistralFormat()
MISTRAL_ARGS = MistralFormat(args_form=True)
GENERIC = GenericFormat()
HARMONY = HarmonyFormat()

FORMATS = {f.name: f for f in (HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS, HARMONY, GENERIC)}


def detect_tool_format(template: str | None) -> ToolFormat:
    """gpt-oss's harmony (``<|channel|>``), Hermes/Qwen (``<tool_call>``), Llama 3.1-3.3 (the
    ``ipython`` role or ``<|python_tag|>``), Mistral (``[TOOL_CALLS]``; ``[ARGS]`` for v11+), else
    the generic JSON format."""
    src = template or ""
    if "<|channel|>" in src:
        return HARMONY
    if "<tool_call>" in src:
        return HERMES
    if "<|start_header_id|>ipython<|end_header_id|>" in src or PYTHON_TAG in src:
        return LLAMA3
    if TOOL_CALLS in src:
        return MISTRAL_ARGS if ARGS in src else MISTRAL
    return GENERIC
