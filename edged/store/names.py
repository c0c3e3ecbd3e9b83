"""Store names: `name[:tag]`, case-insensitive, tag "latest" by default (as Ollama)."""

from __future__ import annotations

import re

from edged.store.errors import StoreError

DEFAULT_TAG = "latest"
_PART = r"[a-z0-9][a-z0-9._-]{0,127}"
_NAME_RE = re.compile(rf"^(?P<name>{_PART})(?::(?P<tag>{_PART}))?$")


def is_store_name(text: str) -> bool:
    """True when `text` looks like a store name (`smollm2-135m-instruct`, `gemma3-270m:latest`),
    not a path: no '/', no '.gguf' suffix, only [a-z0-9._-] and one optional ':tag'."""
    if not isinstance(text, str) or text.lower().endswith(".gguf"):
        return False
    return _NAME_RE.match(text.lower()) is not None


def split_name(text: str) -> tuple[str, str]:
    """(name, tag) of a store name, lower-cased; StoreError naming the text when it is not one."""
    m = _NAME_RE.match(text.lower()) if isinstance(text, str) and not text.lower().endswith(".gguf") else None
    if m is None:
        raise StoreError(f"{text!r} is not a model name (expected name[:tag] of letters, digits, '.', '_', '-')")
    return m.group("name"), m.group("tag") or DEFAULT_TAG


def full_name(text: str) -> str:
    """`name:tag` for any accepted spelling (`SmolLM2` -> `smollm2:latest`)."""
    name, tag = split_name(text)
    return f"{name}:{tag}"
