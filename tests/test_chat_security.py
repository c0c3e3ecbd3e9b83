"""Malicious chat templates: each is refused with ChatTemplateError, quickly, and runs nothing."""

import time

import pytest

from edged.chat import ChatTemplateError, render_chat
from edged.chat_limits import DEFAULT_TIMEOUT_S

MSGS = [{"role": "user", "content": "hi"}]

# Names built at run time dodge the static checks, so these exercise the runtime refusals too.
DYN = "{% set u = '_' %}{% set g = u ~ u ~ 'globals' ~ u ~ u %}{% set c = u ~ u ~ 'class' ~ u ~ u %}"

# Each tries to create CANARY through os reached from Python internals.
ESCAPES = {
    "func_globals": "{{ raise_exception.__globals__['os'].system('touch CANARY') }}",
    "subclasses": "{% for c in ''.__class__.__mro__[1].__subclasses__() %}"
                  "{% if c.__name__ == 'Popen' %}{{ c(['touch', 'CANARY']) }}{% endif %}{% endfor %}",
    "cycler_init": "{{ cycler.__init__.__globals__.os.system('touch CANARY') }}",
    "joiner_init": "{{ joiner.__init__.__globals__.os.system('touch CANARY') }}",
    "namespace_init": "{{ namespace.__init__.__globals__.os.system('touch CANARY') }}",
    "template_ref": "{{ self._TemplateReference__context.cycler.__init__.__globals__.os"
                    ".system('touch CANARY') }}",
    "attr_filter": "{{ (cycler|attr('__init__')|attr('__globals__'))['os'].system('touch CANARY') }}",
    "dyn_attr_filter": DYN + "{{ (strftime_now|attr(g))['os'].system('touch CANARY') }}",
    "dyn_getitem": DYN + "{{ strftime_now[g]['os'].system('touch CANARY') }}",
    "dyn_map_attribute": DYN + "{{ (messages|map(attribute=c)|list)[0] }}",
    "dyn_if_silent": DYN + "{% if messages[c] %}{{ open('CANARY', 'w') }}{% endif %}",
    "format_field": DYN + "{{ ('{0.' ~ g ~ '}').format(strftime_now) }}",
    "open_builtin": "{{ open('CANARY', 'w').write('x') }}",
    "import_os": "{% import 'os' as os %}{{ os.system('touch CANARY') }}",
    "include_file": "{% include 'CANARY' %}",
    "extends_file": "{% extends 'CANARY' %}",
    "mutate_list": "{{ messages.append('x') }}{{ messages.clear() }}",
    "generator_frame": "{% set g = messages|map('string') %}{{ g.gi_frame.f_globals }}",
}

BOMBS = {
    "huge_range": "{% for i in range(10**9) %}{% endfor %}",
    "huge_range_literal": "{% for i in range(1000000000) %}x{% endfor %}",
    "nested_loops": "{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}",
    "str_mul": "{{ 'a' * 10**9 }}",
    "str_mul_literal": "{{ 'a' * 1000000000 }}",
    "pow_bigint": "{{ 2 ** 100000000 }}",
    "pow_tower": "{{ 10 ** 10 ** 10 ** 10 ** 10 }}",  # jinja's ** is left-associative: 10**10000
    "doubling_concat": "{% set ns = namespace(s='a') %}{% for i in range(64) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling_plus": "{% set ns = namespace(s='a') %}{% for i in range(64) %}"
                     "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "list_doubling": "{% set ns = namespace(s=['aaaaaaaa']) %}{% for i in range(64) %}"
                     "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|join }}",
    "nested_list_join": "{% set x = ['a' * 1000] * 1000 %}{% set y = [x] * 1000 %}{{ y|join }}",
    "macro_recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "macro_fanout": "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}"
                    "{{ f(40) }}",
    "macro_buffer": "{% macro m() %}{% for i in range(65000) %}{{ 'x' * 100000 }}{% endfor %}"
                    "{% endmacro %}{{ m()|length }}",
    "set_block_buffer": "{% set s %}{% for i in range(65000) %}{{ 'y' * 100000 }}{% endfor %}"
                        "{% endset %}{{ s|length }}",
    "recursive_loop": "{% for m in [[1]] recursive %}{{ loop([m]) }}{% endfor %}",
    "output_flood": "{% for i in range(60000) %}{{ 'x' * 60000 }}{% endfor %}",
    "center": "{{ 'a'|center(1000000000) }}",
    "ljust": "{{ 'a'.ljust(1000000000) }}",
    "percent_width": "{{ '%999999999d' % 1 }}",
    "percent_star": "{{ '%*d' % (1000000000, 1) }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "format_nested_width": "{{ '{0:>{1}}'.format(1, 1000000000) }}",
    "format_filter_width": "{{ '%999999999s'|format('a') }}",
    "replace_filter": "{% set s = 'a' * 100000 %}{{ s|replace('a', s) }}",
    "replace_method": "{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}",
    "indent": "{% set s = '\\n' * 100000 %}{{ s|indent(100000) }}",
    "expandtabs": "{{ ('\\t' * 100000).expandtabs(100000) }}",
    "translate": "{{ ('a' * 1000).translate({97: 'x' * 100000}) }}",
    "join_method": "{% set x = ['a' * 1000] * 1000 %}{{ ('-' * 1000).join(x) }}",
    "print_container": "{% set x = ['a' * 1000] * 1000 %}{% set y = [x, x] %}{{ y }}",
    "tojson_indent": "{{ messages|tojson(indent=1000000000) }}",
    "lipsum": "{{ lipsum(100000) }}",
    "template_too_large": "x" * 300_000,
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_refused_and_canary_never_written(name, tmp_path, monkeypatch):
    canary = tmp_path / "CANARY"
    monkeypatch.chdir(tmp_path)
    payload = ESCAPES[name].replace("CANARY", str(canary))
    with pytest.raises(ChatTemplateError):
        render_chat(MSGS, payload, bos_token="<s>", eos_token="</s>")
    assert not canary.exists()


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_resource_bomb_refused_within_bounds(name):
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError):
        render_chat(MSGS, BOMBS[name], bos_token="<s>", eos_token="</s>")
    # The render's own limit is DEFAULT_TIMEOUT_S; the margin covers a loaded CI machine.
    assert time.perf_counter() - t0 < DEFAULT_TIMEOUT_S + 2.0


def test_output_limit_and_timeout_parameters():
    with pytest.raises(ChatTemplateError, match="exceeds 100 characters"):
        render_chat(MSGS, "{% for i in range(50) %}abc{% endfor %}", bos_token="", eos_token="",
                    max_output_chars=100)
    slow = "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(30) }}"
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match="time limit"):
        render_chat(MSGS, slow, bos_token="", eos_token="", timeout_s=0.05)
    assert time.perf_counter() - t0 < 1.5


def test_long_conversation_is_not_capped():
    # The output cap scales with the input, so a legitimately long prompt still renders.
    msgs = [{"role": "user", "content": "x" * (1 << 20)}, {"role": "assistant", "content": "y" * (1 << 20)}]
    out = render_chat(msgs, None, bos_token="", eos_token="")
    assert out == ("<|im_start|>user\n" + "x" * (1 << 20) + "<|im_end|>\n<|im_start|>assistant\n"
                   + "y" * (1 << 20) + "<|im_end|>\n<|im_start|>assistant\n")


def test_refusal_happens_before_any_output_side_effect():
    # A template that would print before reaching the unsafe access still returns nothing.
    with pytest.raises(ChatTemplateError, match="unsafe attribute|private"):
        render_chat(MSGS, "ok{{ messages.pop() }}", bos_token="", eos_token="")
    assert MSGS == [{"role": "user", "content": "hi"}]
