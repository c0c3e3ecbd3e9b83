"""Incremental detokenization that never emits part of a UTF-8 character."""

from __future__ import annotations

import codecs


class StreamDecoder:
    """Turns token ids into text one at a time.

    Bytes of an incomplete UTF-8 character are held back until the character completes, so a
    multi-byte character split over byte-fallback tokens is never emitted in pieces. Invalid bytes
    become U+FFFD exactly as in `Tokenizer.decode`: the concatenation of every `push` and the final
    `flush` equals `decode(ids)`.
    """

    def __init__(self, tokenizer, skip_special: bool = True):
        self._piece = tokenizer.token_bytes
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text completed by this token ('' while a character is still incomplete)."""
        return self._utf8.decode(self._piece(token_id, self._skip_special))

    def flush(self) -> str:
        """Whatever is held back at the end of the stream (U+FFFD for an incomplete character)."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
