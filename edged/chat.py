"""Chat templates: turn OpenAI-style messages into the prompt text a model was trained on.

Templates are Jinja sources, usually the GGUF's ``tokenizer.chat_template``, rendered the way
Hugging Face's ``apply_chat_template`` does (``trim_blocks``/``lstrip_blocks``, ``loopcontrols``,
the variables ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools`` and
the helpers ``raise_exception``, ``strftime_now`` and the ``tojson`` filter), inside the bounded
sandbox of :mod:`edged.chat_sandbox`. A file without a template falls back to ChatML, as llama.cpp
does. Named built-ins (:func:`list_builtin_templates`) can be chosen for files that carry none.

>>> render_chat([{"role": "user", "content": "Hi"}], None, bos_token="<s>", eos_token="</s>")
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

import datetime
import functools
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edged.chat_builtin import BUILTIN_TEMPLATES, CHATML
from edged.chat_limits import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TIMEOUT_S, ChatTemplateError
from edged.chat_sandbox import build_environment, compile_template, render_bounded

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "list_builtin_templates",
    "render_chat",
]

MAX_MESSAGE_DEPTH = 16  # nesting of dicts/lists inside messages, tools and extra variables


def list_builtin_templates() -> list[str]:
    """Names accepted as a template by :func:`render_chat` and ``ChatTemplate.from_gguf(override=)``."""
    return sorted(BUILTIN_TEMPLATES)


# ---------------------------------------------------------------------------------------------
# Helpers visible to templates (HF-compatible)

def _raise_exception(message: Any) -> None:
    raise ChatTemplateError(f"chat template raised an error: {message}")


def _strftime_now(fmt: Any) -> str:
    if not isinstance(fmt, str):
        raise ChatTemplateError("strftime_now expects a format string")
    return datetime.datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # As HF's: non-ASCII kept, optional indent; unlike jinja's own filter, no HTML escaping.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


_ENV = None
_ENV_LOCK = threading.Lock()


def _env():
    global _ENV
    with _ENV_LOCK:
        if _ENV is None:
            _ENV = build_environment(
                filters={"tojson": _tojson},
                globals_={"raise_exception": _raise_exception, "strftime_now": _strftime_now},
            )
        return _ENV


@functools.lru_cache(maxsize=32)
def _compiled(source: str):
    return compile_template(_env(), source)


# ---------------------------------------------------------------------------------------------
# Input checking

def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """Copies JSON-like data into plain dicts/lists/scalars, so a template sees no other objects."""
    if depth > MAX_MESSAGE_DEPTH:
        raise ChatTemplateError(f"{where} is nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ChatTemplateError(f"{where} has a non-string key {k!r}")
            out[k] = _plain(v, f"{where}.{k}", depth + 1)
        return out
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise ChatTemplateError(f"{where} has an unsupported value of type {type(value).__name__}")


def _content_text(content: Any, where: str) -> str:
    """Content as one string, as llama.cpp passes it to its legacy templates."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            raise ChatTemplateError(f"{where}[{i}]: only text content parts are supported")
    return "\n".join(parts)


def _check_messages(messages: Any, flatten_content: bool) -> list[dict]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ChatTemplateError("messages must be a list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string")
        msg = _plain(m, f"messages[{i}]")
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatTemplateError(f"messages[{i}].content must be a string, a list of parts or null")
        if flatten_content:
            msg["content"] = _content_text(content, f"messages[{i}].content")
        out.append(msg)
    return out


def _resolve(template: str | None) -> tuple[str, bool]:
    """(Jinja source, is_builtin) for a template argument: None → ChatML, a built-in name, or source."""
    if template is None:
        return CHATML, True
    if not isinstance(template, str):
        raise ChatTemplateError(f"template must be a string or None, got {type(template).__name__}")
    if template in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[template], True
    return template, False


def render_chat(messages: Sequence[Mapping[str, Any]], template: str | None, *, bos_token: str,
                eos_token: str, add_generation_prompt: bool = True, tools: Any = None,
                extra: Mapping[str, Any] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> str:
    """Render ``messages`` with a chat template.

    ``template`` is Jinja source, the name of a built-in (:func:`list_builtin_templates`), or None
    for llama.cpp's fallback (ChatML). ``tools`` (OpenAI tool definitions) is passed as ``tools``
    when given; ``extra`` adds template variables (e.g. ``enable_thinking``) but cannot replace the
    standard ones. The render is bounded by ``timeout_s`` and by ``max_output_chars`` (raised to
    twice the input size for very long conversations). The returned text is exactly what the
    template printed; :meth:`ChatTemplate.render` additionally drops a BOS the tokenizer adds.

    Raises ChatTemplateError (a ValueError) for malformed messages, template syntax errors,
    templates that reach for Python internals or exceed their bounds, and ``raise_exception``.
    """
    source, is_builtin = _resolve(template)
    return _render_source(source, is_builtin, messages, bos_token=bos_token, eos_token=eos_token,
                          add_generation_prompt=add_generation_prompt, tools=tools, extra=extra,
                          timeout_s=timeout_s, max_output_chars=max_output_chars)


def _render_source(source: str, is_builtin: bool, messages: Any, *, bos_token: str, eos_token: str,
                   add_generation_prompt: bool, tools: Any, extra: Any, timeout_s: float,
                   max_output_chars: int) -> str:
    msgs = _check_messages(messages, flatten_content=is_builtin)
    variables: dict[str, Any] = {}
    if extra:
        if not isinstance(extra, Mapping):
            raise ChatTemplateError("extra must be a mapping of template variables")
        variables.update(_plain(extra, "extra"))
    variables.update(
        messages=msgs,
        add_generation_prompt=bool(add_generation_prompt),
        bos_token=str(bos_token),
        eos_token=str(eos_token),
    )
    if tools is not None:
        variables["tools"] = _plain(tools, "tools")
    # A legitimately long conversation must not hit the output cap: scale it with the input.
    input_chars = len(json.dumps([msgs, variables.get("tools"), dict(extra or {})],
                                 ensure_ascii=False, default=str))
    limit = max(int(max_output_chars), 2 * input_chars)
    return render_bounded(_compiled(source), variables, timeout_s=timeout_s, max_output_chars=limit)


_DEFAULT_ADD_BOS = {"llama": True, "bert": True}  # llama.cpp's per-tokenizer defaults
_DEFAULT_ADD_EOS = {"bert": True, "t5": True}


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template bound to a model's special tokens.

    ``source`` is Jinja; ``name`` says where it came from (``"gguf"``, ``"gguf:tool_use"``, a
    built-in name, ``"override"``, or ``"chatml"`` for the fallback). ``add_bos``/``add_eos`` say
    whether the tokenizer adds BOS/EOS itself, in which case :meth:`render` drops a leading BOS /
    trailing EOS the template printed, as llama.cpp does, so the model never sees them twice.
    """

    source: str
    name: str
    bos_token: str = ""
    eos_token: str = ""
    add_bos: bool = False
    add_eos: bool = False

    def __post_init__(self) -> None:
        _compiled(self.source)  # compile now so a bad template fails at load, not at first request

    @property
    def is_builtin(self) -> bool:
        return self.source in BUILTIN_TEMPLATES.values()

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Any = None, extra: Mapping[str, Any] | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        """Prompt text for ``messages``, ready for ``tokenizer.encode(text, add_special=True)``."""
        text = _render_source(
            self.source, self.is_builtin, messages, bos_token=self.bos_token,
            eos_token=self.eos_token, add_generation_prompt=add_generation_prompt, tools=tools,
            extra=extra, timeout_s=timeout_s, max_output_chars=DEFAULT_MAX_OUTPUT_CHARS)
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text

    @classmethod
    def builtin(cls, name: str, *, bos_token: str = "", eos_token: str = "", add_bos: bool = False,
                add_eos: bool = False) -> "ChatTemplate":
        """A named built-in template; unknown names list the known ones."""
        if name not in BUILTIN_TEMPLATES:
            raise ChatTemplateError(
                f"unknown chat template {name!r}; built-ins: {', '.join(list_builtin_templates())}")
        return cls(BUILTIN_TEMPLATES[name], name, bos_token, eos_token, add_bos, add_eos)

    @classmethod
    def from_gguf(cls, gf: Any, override: str | None = None) -> "ChatTemplate":
        """The template of a loaded GGUF file (``edged.quant.load_gguf``).

        ``override`` (a built-in name or Jinja source) wins over the file's
        ``tokenizer.chat_template``. Without either, llama.cpp's order applies: the file's
        ``tokenizer.chat_template.tool_use`` if present, else ChatML. BOS/EOS texts come from the
        vocabulary at ``tokenizer.ggml.bos_token_id``/``eos_token_id``.
        """
        model = gf.get_str("tokenizer.ggml.model", default=None)
        bos = _token_text(gf, "tokenizer.ggml.bos_token_id")
        eos = _token_text(gf, "tokenizer.ggml.eos_token_id")
        add_bos = bool(gf.get_bool("tokenizer.ggml.add_bos_token",
                                   default=_DEFAULT_ADD_BOS.get(model, False)))
        add_eos = bool(gf.get_bool("tokenizer.ggml.add_eos_token",
                                   default=_DEFAULT_ADD_EOS.get(model, False)))
        if override is not None:
            if override in BUILTIN_TEMPLATES:
                return cls(BUILTIN_TEMPLATES[override], override, bos, eos, add_bos, add_eos)
            if "{{" not in override and "{%" not in override:
                raise ChatTemplateError(
                    f"unknown chat template {override!r}; give Jinja source or one of the "
                    f"built-ins: {', '.join(list_builtin_templates())}")
            return cls(override, "override", bos, eos, add_bos, add_eos)
        source = gf.get_str("tokenizer.chat_template", default=None)
        name = "gguf"
        if not source:
            source = gf.get_str("tokenizer.chat_template.tool_use", default=None)
            name = "gguf:tool_use"
        if not source or source == "chatml":
            return cls(CHATML, "chatml", bos, eos, add_bos, add_eos)
        if source in BUILTIN_TEMPLATES:  # llama.cpp also accepts a bare template name here
            return cls(BUILTIN_TEMPLATES[source], source, bos, eos, add_bos, add_eos)
        return cls(source, name, bos, eos, add_bos, add_eos)


def _token_text(gf: Any, id_key: str) -> str:
    """Vocabulary text of the special token whose id is stored at ``id_key`` ("" when absent)."""
    tok_id = gf.get_int(id_key, default=None)
    if tok_id is None:
        return ""
    tokens = gf.get_str_list("tokenizer.ggml.tokens")
    if not 0 <= tok_id < len(tokens):
        raise ChatTemplateError(f"{id_key} = {tok_id} is outside the vocabulary ({len(tokens)} tokens)")
    return tokens[tok_id]
