"""llguidance's tokenizer (LLTokenizer) from edged's GGUF tokenizer, built once per model and kept.

Token bytes are what the token adds to decoded text; control tokens (and user-defined tokens that
look like `<...>`) get llguidance's special-token marker, a leading 0xFF byte, as llama.cpp's
llguidance integration does, so grammars never produce them as text. End-of-generation ids are
llguidance's EOS tokens: the matcher allows them exactly when the grammar accepts.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref

import llguidance as llg

from edged.tokenizer import Tokenizer
from edged.tokenizer.vocab import ATTR_USER_DEFINED

SPECIAL_MARKER = b"\xff"  # llguidance: a token whose bytes start with 0xFF is special

_cache: "weakref.WeakKeyDictionary[Tokenizer, dict]" = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def llg_token_bytes(tok: Tokenizer) -> list[bytes]:
    """Per token id, the bytes llguidance sees (special tokens as 0xFF + their text)."""
    attrs = tok.vocab.attrs
    out: list[bytes] = []
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i, skip_special=True)
        if not b:
            # hidden (control/unknown) or unused: never text; marked so llguidance keeps it apart
            b = SPECIAL_MARKER + (tok.token_bytes(i, skip_special=False) or tok.vocab.tokens[i].encode())
        elif attrs[i] & ATTR_USER_DEFINED and b.startswith(b"<") and b.endswith(b">"):
            b = SPECIAL_MARKER + b  # e.g. Gemma's <start_of_image>: a marker, not text
        out.append(b)
    return out


class _Encoder:
    """The tokenize callback llguidance calls (forced tokens, tokenize_str): edged's own encoder,
    without BOS/EOS and without the SentencePiece space prefix (llguidance tokenizes fragments)."""

    def __init__(self, tok: Tokenizer, tokens: list[bytes]):
        v = tok.vocab
        if v.add_space_prefix or v.add_bos or v.add_eos:
            tok = Tokenizer(dataclasses.replace(v, add_space_prefix=False, add_bos=False, add_eos=False))
        self._tok = tok
        self.tokens = tokens
        self.eos_token_id = v.eos_id if v.eos_id is not None else (v.eog_ids[0] if v.eog_ids else 0)
        self.bos_token_id = v.bos_id

    def __call__(self, data: bytes) -> list[int]:
        text = data.decode("utf-8", errors="replace") if isinstance(data, (bytes, bytearray)) else data
        return self._tok.encode(text, add_special=False, parse_special=False)


def build_lltokenizer(tok: Tokenizer, n_vocab: int | None = None,
                      slices: list[str] | None = None) -> llg.LLTokenizer:
    """A new LLTokenizer for `tok` (seconds on a 262k vocabulary: prefer `lltokenizer_for`).

    n_vocab: the model's logits width when larger than the vocabulary (padded output rows are
    never allowed). slices: llguidance's mask-speed slices (None: its general default).
    """
    tokens = llg_token_bytes(tok)
    if n_vocab is not None:
        if n_vocab < len(tokens):
            raise ValueError(f"n_vocab {n_vocab} is smaller than the vocabulary ({len(tokens)})")
        tokens += [SPECIAL_MARKER + f"<pad{i}>".encode() for i in range(len(tokens), n_vocab)]
    eos = list(tok.eos_ids) or ([tok.eos_id] if tok.eos_id is not None else [])
    wrapper = llg.TokenizerWrapper(_Encoder(tok, tokens))
    return llg.LLTokenizer(wrapper, n_vocab=len(tokens), eos_token=eos or None, slices=slices)


def lltokenizer_for(tok: Tokenizer, n_vocab: int | None = None) -> llg.LLTokenizer:
    """The LLTokenizer of `tok`, built on first use and kept as long as `tok` lives."""
    key = n_vocab or tok.vocab_size
    with _cache_lock:  # one build per model even when requests race
        per = _cache.setdefault(tok, {})
        if key not in per:
            per[key] = build_lltokenizer(tok, n_vocab)
        return per[key]
