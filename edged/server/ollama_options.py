"""Ollama's `options` object -> the OpenAI-shaped fields edged's request parser validates.

Ollama's sampling defaults apply (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 over
the last 64 tokens), so an Ollama client gets what it would from Ollama. Load-time options
(num_ctx, num_gpu, num_thread ...) are the server's flags here and are ignored; sampling options
edged does not implement are a 400 unless they hold their neutral value.
"""

from __future__ import annotations

from typing import Any

from edged.server.errors import APIError, bad_request
from edged.server.schemas import _int, _type_name

# Ollama option -> the OpenAI / edged field that carries it
RENAMED = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
           "seed": "seed", "num_predict": "max_tokens", "repeat_penalty": "repetition_penalty",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
_BACK = {v: k for k, v in RENAMED.items()}

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1}  # Ollama's
DEFAULT_REPEAT_LAST_N = 64

# set by `edged serve` flags, not per request (num_ctx: --ctx), or without effect here
IGNORED = frozenset({"numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv",
                     "logits_all", "vocab_only", "use_mmap", "use_mlock", "embedding_only",
                     "num_thread", "num_keep", "penalize_newline"})
# not implemented: accepted only at the value that turns them off
NEUTRAL = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}

MAX_STOP = 16  # SamplingParams' limit (Ollama models often carry several stop strings)
MAX_STOP_CHARS = 256


def openai_fields(options: Any) -> dict:
    """The OpenAI-shaped request fields of an Ollama `options` object, Ollama's defaults filled in.
    `stop` and `repeat_last_n` are left out: see `stop_strings` and `repeat_last_n`."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise bad_request(f"'options' must be an object, got {_type_name(options)}", "options")
    for name, neutral in NEUTRAL.items():
        v = options.get(name)
        if v is not None and v != neutral:
            raise bad_request(f"'options.{name}' is not supported (only {neutral}, which turns it "
                              "off)", f"options.{name}")
    out = {}
    for name, field in RENAMED.items():
        v = options.get(name)
        if v is None:
            v = DEFAULTS.get(name)
        if name == "num_predict" and _is_number(v) and v < 0:
            v = None  # -1: until a stop condition, -2: fill the context; both are the default here
        if name == "seed" and _is_number(v) and v < 0:
            v = None  # -1: a fresh random seed, as Ollama's default
        if v is not None:
            out[field] = v
    return out


def stop_strings(options: Any) -> tuple[str, ...] | None:
    """`options.stop` validated (a string or up to 16 strings), or None when absent."""
    v = options.get("stop") if isinstance(options, dict) else None
    if v is None:
        return None
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'options.stop' must be a string or an array of strings", "options.stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"'options.stop' holds at most {MAX_STOP} strings, got {len(stops)}",
                          "options.stop")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"each of 'options.stop' must have 1..{MAX_STOP_CHARS} characters",
                          "options.stop")
    return tuple(stops)


def repeat_last_n(options: Any) -> int:
    """`options.repeat_last_n`: the window of the penalties (-1 = the whole history, 0 = off)."""
    if not isinstance(options, dict):
        return DEFAULT_REPEAT_LAST_N
    try:
        return _int(options, "repeat_last_n", lo=-1, default=DEFAULT_REPEAT_LAST_N)
    except APIError as e:
        raise renamed(e) from None


def renamed(e: APIError) -> APIError:
    """An error about an OpenAI field this module filled, reworded to name the Ollama option."""
    name = _BACK.get(e.param) if e.param else None
    if name is None and e.param == "repeat_last_n":
        name = "repeat_last_n"
    if name is None:
        return e
    message = e.message.replace(f"'{e.param}'", f"'options.{name}'")
    return bad_request(message, f"options.{name}", e.code)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
