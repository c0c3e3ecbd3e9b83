"""Ollama's `options` object -> the OpenAI-shaped fields edged's request parser validates.

Ollama's sampling defaults apply (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 over
the last 64 tokens), so an Ollama client gets what it would from Ollama. Load-time options
(num_ctx, num_gpu, num_thread ...) are the server's flags here and are ignored; sampling options
edged does not implement are a 400 unless they hold their neutral value.
"""

from __future__ import annotations


from edged.server import schemas
from edged.server.errors import APIError, bad_request
from edged.server.spec import AnyOf, Array, Field, Integer, Number, Object, String

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


def _same_as(openai_name: str, default=None, **kw) -> Field:
    """An option with the rules of the OpenAI field that carries it."""
    node = schemas.GENERATION.field(openai_name).node
    name = next(k for k, v in RENAMED.items() if v == openai_name)
    return Field(name, node, default=DEFAULTS.get(name, default), **kw)


_STOP = String(min_len=1, max_len=MAX_STOP_CHARS)
# the options edged reads; load-time ones (IGNORED) may be sent and are ignored
OPTIONS = Object(fields=(
    *(_same_as(n) for n in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                            "frequency_penalty", "repetition_penalty")),
    Field("seed", Integer(), description="negative: a random seed"),
    Field("num_predict", Integer(), description="tokens to generate; negative: up to the context"),
    Field("repeat_last_n", Integer(lo=-1), default=DEFAULT_REPEAT_LAST_N,
          description="the penalties' window: -1 the whole history, 0 off"),
    Field("stop", AnyOf((_STOP, Array(_STOP, max_items=MAX_STOP)), what="a string or an array of strings")),
    Field("mirostat", Integer(), description="only 0 (off)"),
    Field("typical_p", Number(), description="only 1 (off)"),
    Field("tfs_z", Number(), description="only 1 (off)"),
), description="ignored: " + ", ".join(sorted(IGNORED)))


def openai_fields(options: dict | None) -> dict:
    """The OpenAI-shaped request fields of an Ollama `options` object (checked by OPTIONS),
    Ollama's defaults filled in. `stop` and `repeat_last_n` are left out: see `stop_strings`
    and `repeat_last_n`."""
    if options is None:
        options = {}
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


def stop_strings(options: dict | None) -> tuple[str, ...] | None:
    """`options.stop` (a string or up to 16 strings, checked by OPTIONS), or None when absent."""
    v = (options or {}).get("stop")
    if v is None:
        return None
    return (v,) if isinstance(v, str) else tuple(v)


def repeat_last_n(options: dict | None) -> int:
    """`options.repeat_last_n`: the window of the penalties (-1 = the whole history, 0 = off)."""
    v = (options or {}).get("repeat_last_n")
    return DEFAULT_REPEAT_LAST_N if v is None else v


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
