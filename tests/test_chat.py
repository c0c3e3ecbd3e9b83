"""Chat templates: llama.cpp's fallback renders, built-in formats, HF-compatible helpers."""

import json

import pytest

from edged.chat import ChatTemplate, ChatTemplateError, list_builtin_templates, render_chat
from tests.helpers.model import default_model_path, llamacpp_reference

CONV = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a prime number."},
    {"role": "assistant", "content": " 7 "},
    {"role": "user", "content": "Another one?"},
]

# What llama.cpp's llm_chat_apply_template (src/llama-chat.cpp) prints for CONV with a generation
# prompt, after dropping the leading BOS the tokenizer adds (llama.cpp's jinja path does the same).
EXPECTED = {
    "chatml": "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"
              "<|im_start|>user\nName a prime number.<|im_end|>\n"
              "<|im_start|>assistant\n 7 <|im_end|>\n"
              "<|im_start|>user\nAnother one?<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nYou are a terse assistant.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nName a prime number.<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n7<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nAnother one?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "gemma": "<start_of_turn>user\nYou are a terse assistant.\n\nName a prime number.<end_of_turn>\n"
             "<start_of_turn>model\n7<end_of_turn>\n"
             "<start_of_turn>user\nAnother one?<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nYou are a terse assistant.<|end|>\n<|user|>\nName a prime number.<|end|>\n"
            "<|assistant|>\n 7 <|end|>\n<|user|>\nAnother one?<|end|>\n<|assistant|>\n",
    # mistral-v3: system text opens the first [INST]; assistant trimmed; no generation prompt.
    "mistral": "[INST] You are a terse assistant.\n\nName a prime number.[/INST] 7</s>"
               "[INST] Another one?[/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] You are a terse assistant.[/SYSTEM_PROMPT]"
                  "[INST] Name a prime number.[/INST]  7 </s>[INST] Another one?[/INST]",
    "qwen": "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"
            "<|im_start|>user\nName a prime number.<|im_end|>\n"
            "<|im_start|>assistant\n 7 <|im_end|>\n"
            "<|im_start|>user\nAnother one?<|im_end|>\n<|im_start|>assistant\n",
}
BOS = {"llama3": "<|begin_of_text|>", "gemma": "<bos>", "mistral": "<s>", "mistral-v7": "<s>"}


@pytest.mark.parametrize("case", range(2))
def test_llamacpp_reference_renders_exact(case):
    ref = llamacpp_reference()["chat"][case]
    out = render_chat(ref["messages"], None, bos_token="<bos>", eos_token="<eos>")
    assert out == ref["prompt"]


class FakeGGUF:
    """The typed accessors of edged.quant.GGUFFile over a plain dict."""

    def __init__(self, meta):
        self.meta = meta

    def _get(self, key, default, types):
        if key not in self.meta:
            if default is KeyError:
                raise KeyError(key)
            return default
        assert isinstance(self.meta[key], types), key
        return self.meta[key]

    def get_str(self, key, default=KeyError):
        return self._get(key, default, str)

    def get_int(self, key, default=KeyError):
        return self._get(key, default, int)

    def get_bool(self, key, default=KeyError):
        return self._get(key, default, bool)

    def get_str_list(self, key, default=KeyError):
        return self._get(key, default, list)


def fake_gemma(**extra):
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>", "<unk>", "hi"],
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    meta.update(extra)
    return FakeGGUF(meta)


def test_from_gguf_without_template_falls_back_to_chatml():
    ct = ChatTemplate.from_gguf(fake_gemma())
    assert (ct.name, ct.bos_token, ct.eos_token, ct.add_bos, ct.add_eos) == ("chatml", "<bos>", "<eos>", True, False)
    for ref in llamacpp_reference()["chat"]:
        assert ct.render(ref["messages"]) == ref["prompt"]


def test_default_model_file_renders_reference():
    from edged.quant import load_gguf

    ct = ChatTemplate.from_gguf(load_gguf(default_model_path()))
    assert (ct.name, ct.bos_token, ct.eos_token) == ("chatml", "<bos>", "<eos>")
    for ref in llamacpp_reference()["chat"]:
        assert ct.render(ref["messages"]) == ref["prompt"]


def test_from_gguf_template_sources_and_overrides():
    tmpl = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}"
    ct = ChatTemplate.from_gguf(fake_gemma(**{"tokenizer.chat_template": tmpl}))
    assert ct.name == "gguf"
    # Leading BOS dropped because the tokenizer adds it; the EOS stays (add_eos is false).
    assert ct.render([{"role": "user", "content": "x"}]) == "[user]x<eos>"
    tool_use = FakeGGUF({**fake_gemma().meta, "tokenizer.chat_template.tool_use": tmpl})
    assert ChatTemplate.from_gguf(tool_use).name == "gguf:tool_use"
    over = ChatTemplate.from_gguf(fake_gemma(**{"tokenizer.chat_template": tmpl}), override="gemma")
    assert over.render(CONV) == EXPECTED["gemma"]
    src = ChatTemplate.from_gguf(fake_gemma(), override="{{ messages[0].content }}!")
    assert (src.name, src.render(CONV)) == ("override", "You are a terse assistant.!")
    with pytest.raises(ChatTemplateError, match="unknown chat template 'nope'.*chatml"):
        ChatTemplate.from_gguf(fake_gemma(), override="nope")
    with pytest.raises(ChatTemplateError, match="outside the vocabulary"):
        ChatTemplate.from_gguf(fake_gemma(**{"tokenizer.ggml.bos_token_id": 99}))
    with pytest.raises(ChatTemplateError, match="syntax error"):
        ChatTemplate.from_gguf(fake_gemma(**{"tokenizer.chat_template": "{% for %}"}))


def test_builtin_names():
    assert {"chatml", "llama3", "gemma", "qwen", "phi3", "mistral"} <= set(list_builtin_templates())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_renders_real_format(name):
    bos = BOS.get(name, "")
    raw = render_chat(CONV, name, bos_token=bos or "<s>", eos_token="</s>")
    # Llama 3, Gemma and Mistral templates print BOS themselves, as the real ones do.
    assert raw == (bos + EXPECTED[name] if bos else EXPECTED[name])
    ct = ChatTemplate.builtin(name, bos_token=bos or "<s>", eos_token="</s>", add_bos=True)
    assert ct.render(CONV) == EXPECTED[name]


def test_builtin_without_generation_prompt_and_qwen_default_system():
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert render_chat(msgs, "chatml", bos_token="", eos_token="", add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n")
    assert render_chat(msgs[:1], "qwen", bos_token="", eos_token="") == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_builtin_flattens_content_parts():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None}]
    assert render_chat(msgs, "phi3", bos_token="", eos_token="", add_generation_prompt=False) == (
        "<|user|>\na\nb<|end|>\n<|assistant|>\n<|end|>\n")
    with pytest.raises(ChatTemplateError, match="text content parts"):
        render_chat([{"role": "user", "content": [{"type": "image_url"}]}], "chatml",
                    bos_token="", eos_token="")


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Météo d'une ville",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_qwen_tools_and_tool_calls():
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18°C"},
    ]
    out = render_chat(msgs, "qwen", bos_token="", eos_token="", tools=TOOLS)
    tool_json = json.dumps(TOOLS[0], ensure_ascii=False)
    assert out == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + tool_json +
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18°C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    assert "Météo" in out  # tojson keeps non-ASCII, as HF's does


def test_hf_helpers_tojson_indent_strftime_raise_extra():
    tmpl = (
        "{%- if tools is defined %}{{ tools | tojson(indent=2) }}\n{% endif -%}"
        "{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true) }}|{{ strftime_now('%Y') | length }}|"
        "{{ flavour }}|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    out = render_chat([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}], tmpl,
                      bos_token="", eos_token="", tools=TOOLS, extra={"flavour": "mint"})
    assert out == json.dumps(TOOLS, indent=2, ensure_ascii=False) + '\n{"a": "é", "b": 1}|4|mint|one'
    alt = ("{% for m in messages %}{% if (m.role == 'user') != loop.index0 is even %}"
           "{{ raise_exception('Conversation roles must alternate') }}{% endif %}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], alt,
                    bos_token="", eos_token="")


def test_realistic_template_constructs_are_allowed():
    # The constructs real HF templates use: namespace, slicing, selectattr, string methods,
    # is defined / none tests, loop.last, inline if, default, dict access both ways.
    tmpl = (
        "{%- set ns = namespace(sys='', n=0) -%}"
        "{%- if messages[0].role == 'system' %}{% set ns.sys = messages[0]['content'].strip() %}"
        "{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif -%}"
        "{{ ns.sys | upper }}:"
        "{%- for m in rest | selectattr('role', 'equalto', 'user') %}{% set ns.n = ns.n + 1 %}{% endfor -%}"
        "{{ ns.n }}:{% for m in rest %}{{ m.role[0] }}{{ '' if loop.last else ',' }}{% endfor %}:"
        "{{ (rest | map(attribute='content') | join('|')).replace(' ', '_') }}:"
        "{{ rest[-1].name | default('anon') }}:{{ 'x' if rest[-1].tool_calls is not defined }}"
        "{{ '%s-%d' | format('a', 3) }}:{{ '{}+{}'.format(1, 2) }}:{{ range(3) | list | length }}"
    )
    out = render_chat(CONV, tmpl, bos_token="", eos_token="")
    assert out == ("YOU ARE A TERSE ASSISTANT.:2:u,a,u:Name_a_prime_number.|_7_|Another_one?:"
                   "anon:xa-3:1+2:3")


def test_plain_data_and_recursive_loops_are_not_refused():
    # Large integers as data (not as widths/counts) and recursive loops are ordinary template use.
    tmpl = ("{{ namespace(ts=1700000000).ts }}|{{ '%d' % 1700000000 }}|{{ 1700000000 | string }}|"
            "{% for x in [1, [2, [3]]] recursive %}{% if x is iterable %}{{ loop(x) }}"
            "{% else %}{{ x }}{% endif %}{% endfor %}")
    assert render_chat(CONV, tmpl, bos_token="", eos_token="") == "1700000000|1700000000|1700000000|123"


def test_bad_messages_are_clear_errors():
    for bad, match in [
        ("hello", "messages must be a list"),
        ([{"content": "x"}], r"messages\[0\].role"),
        (["x"], r"messages\[0\] must be an object"),
        ([{"role": "user", "content": 3}], "content must be"),
        ([{"role": "user", "content": "x", "obj": object()}], "unsupported value"),
    ]:
        with pytest.raises(ChatTemplateError, match=match):
            render_chat(bad, None, bos_token="", eos_token="")
    assert issubclass(ChatTemplateError, ValueError)
