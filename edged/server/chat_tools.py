"""Tool calling and reasoning for /v1/chat/completions: what the template is given, which
grammar the output is generated under, and how the output becomes an OpenAI message.

The tool-call format comes from the chat template's text (edged.toolcall.detect_tool_format).
A template with a tool syntax of its own renders `tools` and the history's tool calls itself;
for the generic format (templates with none, the default model's) the tools are listed in a
system prompt and history calls/results are written as the JSON the generic grammar produces,
as llama.cpp's polyfills do.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import llguidance as llg

from edged.structured import Constraint, ConstraintError, schema_constraint
from edged.toolcall import (GENERIC, OutputParser, ParsedMessage, ReasoningSpec, ToolFormat,
                            ToolRequest, detect_tool_format, opens_in_reasoning, reasoning_spec,
                            tools_system_prompt)


@dataclass
class ChatPlan:
    """One chat request's tool format, tools and reasoning split."""

    fmt: ToolFormat
    tools: ToolRequest | None
    reasoning: ReasoningSpec | None
    starts_in_reasoning: bool = False

    @property
    def tools_active(self) -> bool:
        return self.tools is not None and self.tools.active

    @property
    def parses(self) -> bool:
        """Whether the output goes through the tool-call / reasoning parser."""
        return self.tools_active or self.reasoning is not None

    def parser(self) -> OutputParser:
        return OutputParser(self.fmt, self.tools, self.reasoning, self.starts_in_reasoning)


def plan_chat(template_source: str, tools: ToolRequest | None, reasoning_format: str) -> ChatPlan:
    return ChatPlan(detect_tool_format(template_source), tools,
                    reasoning_spec(template_source, reasoning_format))


# -- rendering ----------------------------------------------------------------------------------

def _arguments_object(args):
    """Call arguments as an object for templates (`tojson` of a string would quote it twice)."""
    if isinstance(args, str):
        try:
            value = json.loads(args)
        except ValueError:
            return args
        return value if isinstance(value, dict) else args
    return args


def _generic_history(messages: list) -> list:
    """Tool calls and results as the generic format's JSON, in user/assistant turns only
    (templates without tool support often insist the roles alternate)."""
    out: list[dict] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"],
                      "arguments": _arguments_object(c["function"].get("arguments", {}))}
                     for c in m["tool_calls"]]
            m = {"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)}
        elif role == "tool":
            body = {"tool_response": {"tool_call_id": m.get("tool_call_id"), "content": content}}
            m = {"role": "user", "content": json.dumps(body, ensure_ascii=False)}
        if out and out[-1]["role"] == m["role"] and m["role"] in ("user", "tool"):
            out[-1] = {**out[-1], "content": f"{_text(out[-1].get('content'))}\n\n{_text(m.get('content'))}"}
        else:
            out.append(m)
    return out


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content)
    return content or ""


def _with_system(messages: list, text: str) -> list:
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{_text(first.get('content'))}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def render_inputs(plan: ChatPlan, messages: list, tools: list | None) -> tuple[list, list | None]:
    """(messages, tools) to give the chat template."""
    # OpenAI's "developer" messages replace "system" ones; templates only know "system"
    messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    if plan.fmt is GENERIC:
        messages = _generic_history(messages)
        if plan.tools_active:
            messages = _with_system(messages, tools_system_prompt(plan.tools))
        return messages, tools
    fixed = []
    for m in messages:
        if plan.fmt.frames_reasoning and m.get("role") == "assistant" and m.get("reasoning_content") \
                and not m.get("thinking"):
            m = {**m, "thinking": m["reasoning_content"]}  # gpt-oss's template reads the analysis there
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c["function"],
                                        "arguments": _arguments_object(c["function"].get("arguments", {}))}}
                     for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        fixed.append(m)
    return fixed, tools


def note_prompt(plan: ChatPlan, prompt: str) -> None:
    """Record whether the rendered prompt leaves a thinking block open."""
    plan.starts_in_reasoning = opens_in_reasoning(prompt, plan.reasoning)


def render_prompt(chat, plan: ChatPlan, messages: list, tools: list | None, extra=None,
                  suffix: str = "") -> str:
    """The chat template over the request's messages and tools (as the plan's format wants them),
    then `suffix` (an assistant prefill); noted for a thinking block it leaves open."""
    messages, tools = render_inputs(plan, messages, tools)
    text = chat.render(messages, add_generation_prompt=True, tools=tools, extra=extra) + suffix
    note_prompt(plan, text)
    return text


# -- constraint -----------------------------------------------------------------------------------

def submit_options(plan: ChatPlan, response: Constraint | None):
    """constraint_options bound for route_common._submit, or None when the response_format (if
    any) applies alone: tools are active, or a grammar must wait for the reasoning to end."""
    if plan.tools_active or (response is not None and plan.reasoning is not None):
        return functools.partial(constraint_options, plan, response=response)
    return None


def constraint_options(plan: ChatPlan, grammars, response: Constraint | None) -> tuple[Constraint | None, dict]:
    """The request's grammar (the tools' when they are active, else the response_format's) and
    the ModelGrammars.request_constraint options: lazy triggers, the reasoning end."""
    constraint, triggers = response, []
    if plan.tools_active:
        spec = plan.fmt.constraint(plan.tools, grammars.token_ref)
        constraint = None
        if spec is not None:
            constraint = _spec_constraint(spec)
            if spec.lazy:
                triggers = [grammars.trigger(t.text, t.at_start) for t in spec.triggers]
    opts: dict = {"triggers": triggers}
    # a harmony call may come before (or instead of) the final answer: its grammar waits for its trigger only
    framed = plan.tools_active and plan.fmt.frames_reasoning
    if constraint is not None and plan.reasoning is not None and not framed:
        opts.update(start_after=plan.reasoning.end, starts_in_reasoning=plan.starts_in_reasoning,
                    think_opener=plan.reasoning.start)
    return constraint, opts


def _spec_constraint(spec) -> Constraint:
    if spec.kind == "json_schema":
        return schema_constraint(spec.schema, "tools")
    try:
        return Constraint(llg.LLMatcher.grammar_from_lark(spec.lark), "tools", "grammar")
    except ValueError as e:
        raise ConstraintError("tools", f"the tools' grammar does not compile: {e}") from None


# -- output ---------------------------------------------------------------------------------------

def message_of(parsed: ParsedMessage) -> dict:
    """The OpenAI message: content (a string unless there are tool calls), tool_calls, and the
    reasoning as `reasoning_content` (llama.cpp) and `reasoning` (vLLM)."""
    msg = parsed.to_openai()
    if not parsed.tool_calls:
        msg["content"] = parsed.content
    if parsed.reasoning_content is not None:
        msg["reasoning"] = parsed.reasoning_content
    return msg


def finish_of(parsed: ParsedMessage, engine_reason: str | None) -> str | None:
    """"tool_calls" when a stopped generation holds calls; the engine's reason otherwise."""
    if engine_reason == "stop" and parsed.tool_calls:
        return "tool_calls"
    return engine_reason
