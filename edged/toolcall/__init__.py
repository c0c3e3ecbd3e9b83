"""Tool calling and reasoning for chat outputs (issue 14): format detection from the chat
template, per-format parsers (complete and streaming), request validation, and the data the
constrained-decoding side needs (schemas, Lark grammars, lazy triggers)."""

from .calls import (ParsedMessage, StreamDelta, ToolCall, ToolCallDelta, ToolError,
                    openai_call_id)
from .base import ToolFormat
from .constraint import ConstraintSpec, Trigger
from .detect import FORMATS, GENERIC, HARMONY, HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS, detect_tool_format
from .generic import SYSTEM_HINT, tools_system_prompt
from .reasoning import (HARMONY_REASONING, THINK, ReasoningSpec, detect_reasoning, opens_in_reasoning,
                        reasoning_spec, split_reasoning)
from .stream import OutputParser, parse_output
from .tools import Function, ToolRequest, parse_tool_request

__all__ = [
    "ConstraintSpec", "FORMATS", "Function", "GENERIC", "HARMONY", "HARMONY_REASONING", "HERMES", "LLAMA3",
    "MISTRAL", "MISTRAL_ARGS", "OutputParser", "ParsedMessage", "ReasoningSpec", "StreamDelta", "SYSTEM_HINT",
    "THINK", "ToolCall", "ToolCallDelta", "ToolError", "ToolFormat", "ToolRequest", "Trigger",
    "detect_reasoning", "detect_tool_format", "openai_call_id", "opens_in_reasoning",
    "parse_output", "parse_tool_request", "reasoning_spec", "split_reasoning",
    "tools_system_prompt",
]
