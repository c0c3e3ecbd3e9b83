"""Format and reasoning detection from template text (built-ins and minimal real-shaped snippets)."""

import pytest

from edged.chat_builtin import BUILTIN_TEMPLATES
from edged.toolcall import (GENERIC, HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS, THINK, detect_reasoning,
                            detect_tool_format, opens_in_reasoning, reasoning_spec)

LLAMA31 = (
    "{{- bos_token }}{%- if builtin_tools is defined or tools is not none %}"
    "{{- \"Environment: ipython\\n\" }}{%- endif %}"
    "{%- for message in messages %}{%- if 'tool_calls' in message %}"
    "{%- if builtin_tools is defined and tool_call.name in builtin_tools %}"
    "{{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}{%- else %}"
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}{%- endif %}"
    "{%- elif message.role == \"tool\" or message.role == \"ipython\" %}"
    "{{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}{%- endif %}{%- endfor %}")
LLAMA32 = ("{%- if message.role == \"tool\" or message.role == \"ipython\" %}"
           "{{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}{%- endif %}")
MISTRAL_NEMO = ("{%- if message.tool_calls %}{{- \"[TOOL_CALLS][\" }}{%- for tool_call in "
                "message.tool_calls %}{{- tool_call.function|tojson }}{%- endfor %}{{- \"]\" }}"
                "{%- endif %}")
MISTRAL_V11 = ("{%- for tool in message.tool_calls %}{{- '[TOOL_CALLS]' + tool.function.name + "
               "'[ARGS]' + tool.function.arguments|tojson }}{%- endfor %}")
QWEN3 = ("{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
         "<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n"
         "</tool_call>{%- endif %}{%- if reasoning_content %}{{ '<think>\\n' + reasoning_content"
         " + '\\n</think>\\n\\n' }}{%- endif %}{%- if add_generation_prompt %}"
         "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking "
         "is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
DEEPSEEK_R1_DISTILL = ("{% if '</think>' in content %}{% set content = content.split('</think>')"
                       "[-1] %}{% endif %}{% if add_generation_prompt %}{{'<\uff5cAssistant\uff5c>"
                       "<think>\\n'}}{% endif %}")


@pytest.mark.parametrize("name, fmt", [
    ("qwen", HERMES), ("chatml", GENERIC), ("gemma", GENERIC), ("llama3", GENERIC),
    ("mistral", GENERIC), ("mistral-v7", GENERIC), ("phi3", GENERIC)])
def test_builtin_templates(name, fmt):
    assert detect_tool_format(BUILTIN_TEMPLATES[name]) is fmt
    assert detect_reasoning(BUILTIN_TEMPLATES[name]) is None


@pytest.mark.parametrize("src, fmt", [
    (LLAMA31, LLAMA3), (LLAMA32, LLAMA3), (MISTRAL_NEMO, MISTRAL), (MISTRAL_V11, MISTRAL_ARGS),
    (QWEN3, HERMES), (DEEPSEEK_R1_DISTILL, GENERIC), (None, GENERIC), ("", GENERIC)])
def test_snippets(src, fmt):
    assert detect_tool_format(src) is fmt


def test_reasoning_detection_and_open_prompt():
    assert detect_reasoning(QWEN3) == THINK == detect_reasoning(DEEPSEEK_R1_DISTILL)
    assert reasoning_spec(QWEN3, "none") is None and reasoning_spec(QWEN3, "auto") == THINK
    with pytest.raises(ValueError):
        reasoning_spec(QWEN3, "deepseek")
    assert opens_in_reasoning("<\uff5cUser\uff5c>hi<\uff5cAssistant\uff5c><think>\n", THINK)
    assert not opens_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)
    assert not opens_in_reasoning("<|im_start|>assistant\n", THINK)
    assert not opens_in_reasoning("<think>", None)
