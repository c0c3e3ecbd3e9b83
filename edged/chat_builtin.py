"""Named built-in chat templates, as Jinja sources.

Each renders what llama.cpp's ``llm_chat_apply_template`` (src/llama-chat.cpp) produces for the
format of the same name. Where the real model's template starts with ``bos_token`` (Llama 3, Gemma,
Mistral) so does ours; :meth:`edged.chat.ChatTemplate.render` then drops that leading BOS text when
the tokenizer adds BOS itself, as llama.cpp's ``common_chat_template_direct_apply`` does, which
gives llama.cpp's output exactly. ``qwen`` is ChatML with Qwen 2.5's default system prompt and its
tool-calling preamble.

Message ``content`` reaches these templates as a string: :func:`edged.chat.render_chat` joins
OpenAI content parts with newlines and turns ``None`` into ``""`` for built-ins, as llama.cpp does
for its legacy templates.
"""

from __future__ import annotations

# The fallback llama.cpp uses when a GGUF has no tokenizer.chat_template (common/chat.cpp).
CHATML = (
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

LLAMA3 = (
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "{%- endif -%}"
)

# Gemma has no system role: system text (trimmed) is prepended to the next user turn.
GEMMA = (
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(system='') -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'system' -%}\n"
    "{%- set ns.system = ns.system + message['content'] | trim -%}\n"
    "{%- else -%}\n"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "{{- '<start_of_turn>' + role + '\\n' -}}\n"
    "{%- if ns.system and role != 'model' -%}\n"
    "{{- ns.system + '\\n\\n' -}}\n"
    "{%- set ns.system = '' -%}\n"
    "{%- endif -%}\n"
    "{{- message['content'] | trim + '<end_of_turn>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<start_of_turn>model\\n' -}}\n"
    "{%- endif -%}"
)

PHI3 = (
    "{%- for message in messages -%}\n"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|assistant|>\\n' -}}\n"
    "{%- endif -%}"
)

# Mistral v3 (Mistral-7B-Instruct-v0.3): the system text opens the first [INST] block; assistant
# turns are trimmed and closed with </s>. The format has no generation prompt.
MISTRAL = (
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(inside=false) -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if not ns.inside -%}\n"
    "{{- '[INST] ' -}}\n"
    "{%- set ns.inside = true -%}\n"
    "{%- endif -%}\n"
    "{%- if message['role'] == 'system' -%}\n"
    "{{- message['content'] + '\\n\\n' -}}\n"
    "{%- elif message['role'] == 'user' -%}\n"
    "{{- message['content'] + '[/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- ' ' + message['content'] | trim + '</s>' -}}\n"
    "{%- set ns.inside = false -%}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}"
)

# Mistral v7 (Mistral Large 2411, Small 3): [SYSTEM_PROMPT] blocks, no generation prompt.
MISTRAL_V7 = (
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'system' -%}\n"
    "{{- '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' -}}\n"
    "{%- elif message['role'] == 'user' -%}\n"
    "{{- '[INST] ' + message['content'] + '[/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- ' ' + message['content'] + '</s>' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}"
)

QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Qwen 2.5: ChatML, a default system prompt, tools listed as JSON inside <tools></tools>, tool calls
# as <tool_call> JSON and tool results folded into user turns as <tool_response>.
QWEN = (
    "{%- set default_system = '" + QWEN_DEFAULT_SYSTEM + "' -%}\n"
    "{%- if tools %}\n"
    "{{- '<|im_start|>system\\n' }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "{{- messages[0]['content'] }}\n"
    "{%- else %}\n"
    "{{- default_system }}\n"
    "{%- endif %}\n"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}\n"
    "{%- for tool in tools %}\n"
    "{{- '\\n' }}\n"
    "{{- tool | tojson }}\n"
    "{%- endfor %}\n"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'assistant' %}\n"
    "{{- '<|im_start|>' + message.role }}\n"
    "{%- if message.content %}\n"
    "{{- '\\n' + message.content }}\n"
    "{%- endif %}\n"
    "{%- for tool_call in message.tool_calls %}\n"
    "{%- if tool_call.function is defined %}\n"
    "{%- set tool_call = tool_call.function %}\n"
    "{%- endif %}\n"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "{{- tool_call.name }}\n"
    "{{- '\", \"arguments\": ' }}\n"
    "{{- tool_call.arguments | tojson }}\n"
    "{{- '}\\n</tool_call>' }}\n"
    "{%- endfor %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'tool' %}\n"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}\n"
    "{{- '<|im_start|>user' }}\n"
    "{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' }}\n"
    "{{- message.content }}\n"
    "{{- '\\n</tool_response>' }}\n"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": CHATML,
    "gemma": GEMMA,
    "llama3": LLAMA3,
    "mistral": MISTRAL,
    "mistral-v7": MISTRAL_V7,
    "phi3": PHI3,
    "qwen": QWEN,
}
