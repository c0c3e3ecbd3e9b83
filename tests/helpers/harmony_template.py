"""A gpt-oss-style (harmony) chat template for the tests, written after the shape of OpenAI's
gpt-oss template (the one llama.cpp keeps in models/templates): a system header with the date
and reasoning effort, a developer message with the instructions and the tools as a TypeScript-like
`functions` namespace, prior analysis only before a pending tool call, assistant tool calls as
`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>`, tool
results from `functions.NAME to=assistant`, and `<|start|>assistant` as the generation prompt.
It uses the same Jinja features as the real one (recursive macros, namespace(), strftime_now,
tojson, raise_exception, slicing loop_messages[loop.index:], `is mapping` / `is iterable` tests).
"""

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                  "<|call|>")

HARMONY_CHAT_TEMPLATE = r"""
{%- macro render_type(spec) -%}
    {%- if spec.type == "array" -%}
        {{- (render_type(spec['items']) if 'items' in spec else 'any') + '[]' -}}
    {%- elif spec.type is defined and spec.type is iterable and spec.type is not string and spec.type is not mapping -%}
        {{- spec.type | join(" | ") -}}
    {%- elif spec.type == "string" and spec.enum -%}
        {{- '"' + spec.enum | join('" | "') + '"' -}}
    {%- elif spec.type in ["integer", "number"] -%}
        {{- "number" -}}
    {%- elif spec.type in ["string", "boolean"] -%}
        {{- spec.type -}}
    {%- elif spec.type == "object" and spec.properties -%}
        {{- "{\n" -}}
        {%- for name, sub in spec.properties.items() -%}
            {{- name + ("" if name in (spec.required or []) else "?") + ": " + render_type(sub) -}}
            {{- ",\n" if not loop.last else "\n" -}}
        {%- endfor -%}
        {{- "}" -}}
    {%- else -%}
        {{- "any" -}}
    {%- endif -%}
{%- endmacro -%}
{{- "<|start|>system<|message|>" -}}
{{- (model_identity if model_identity is defined else "You are ChatGPT, a large language model trained by OpenAI.") + "\n" -}}
{{- "Knowledge cutoff: 2024-06\nCurrent date: " + strftime_now("%Y-%m-%d") + "\n\n" -}}
{{- "Reasoning: " + (reasoning_effort if reasoning_effort is defined else "medium") + "\n\n" -}}
{{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." -}}
{%- if tools -%}{{- "\nCalls to these tools must go to the commentary channel: 'functions'." -}}{%- endif -%}
{{- "<|end|>" -}}
{%- if messages[0].role in ["system", "developer"] -%}
    {%- set developer = messages[0].content -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set developer = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- if developer or tools -%}
    {{- "<|start|>developer<|message|>" -}}
    {%- if developer -%}{{- "# Instructions\n\n" + developer + "\n\n" -}}{%- endif -%}
    {%- if tools -%}
        {{- "# Tools\n\n## functions\n\nnamespace functions {\n\n" -}}
        {%- for tool in tools -%}
            {%- set fn = tool.function -%}
            {%- if fn.description -%}{{- "// " + fn.description + "\n" -}}{%- endif -%}
            {%- if fn.parameters and fn.parameters.properties -%}
                {{- "type " + fn.name + " = (_: " + render_type(fn.parameters) + ") => any;\n\n" -}}
            {%- else -%}
                {{- "type " + fn.name + " = () => any;\n\n" -}}
            {%- endif -%}
        {%- endfor -%}
        {{- "} // namespace functions" -}}
    {%- endif -%}
    {{- "<|end|>" -}}
{%- endif -%}
{%- set last_call = namespace(name=none) -%}
{%- for message in loop_messages -%}
    {%- if message.role == "assistant" -%}
        {%- if message.content and "<|channel|>" in message.content -%}
            {{- raise_exception("pass the analysis in 'thinking' and the answer in 'content', not <|channel|> tags") -}}
        {%- endif -%}
        {%- if "tool_calls" in message and message.tool_calls -%}
            {%- set later_final = namespace(found=false) -%}
            {%- for future in loop_messages[loop.index:] -%}
                {%- if future.role == "assistant" and "tool_calls" not in future -%}
                    {%- set later_final.found = true -%}
                {%- endif -%}
            {%- endfor -%}
            {%- set call = message.tool_calls[0] -%}
            {%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}
            {%- if "thinking" in message and message.thinking and not later_final.found -%}
                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" -}}
            {%- endif -%}
            {{- "<|start|>assistant to=functions." + call.name + "<|channel|>commentary json<|message|>" -}}
            {{- call.arguments | tojson + "<|call|>" -}}
            {%- set last_call.name = call.name -%}
        {%- else -%}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" -}}
            {%- set last_call.name = none -%}
        {%- endif -%}
    {%- elif message.role == "tool" -%}
        {%- if last_call.name is none -%}
            {{- raise_exception("a tool message needs an earlier assistant tool call") -}}
        {%- endif -%}
        {{- "<|start|>functions." + last_call.name + " to=assistant<|channel|>commentary<|message|>" -}}
        {{- message.content | tojson + "<|end|>" -}}
    {%- elif message.role == "user" -%}
        {{- "<|start|>user<|message|>" + message.content + "<|end|>" -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}
"""
