"""Turning sampled tokens into text deltas: incremental detokenization, EOS and stop strings."""

from __future__ import annotations


def held_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string (or trigger):
    the text that must be held back until the next delta decides it."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class OutputState:
    """Per-request text state. `decoder` is the tokenizer's streaming detokenizer (push/flush)."""

    def __init__(self, decoder, stop: tuple[str, ...] = (), eos_ids: frozenset[int] = frozenset(),
                 ignore_eos: bool = False):
        self.decoder = decoder
        self.stop = tuple(s for s in stop if s)
        self.eos_ids = eos_ids
        self.ignore_eos = ignore_eos
        self.pending = ""  # decoded text not yet emitted (could start a stop string)

    def on_token(self, token_id: int, is_last: bool) -> tuple[str, str | None]:
        """Feed one generated token; returns (text to emit, finish reason or None).

        `is_last` says max_tokens is reached with this token (finish "length").
        """
        if token_id in self.eos_ids and not self.ignore_eos:
            return self.pending + self.decoder.flush(), "stop"
        self.pending += self.decoder.push(token_id)
        if self.stop:
            cut = min((i for i in (self.pending.find(s) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                text, self.pending = self.pending[:cut], ""
                return text, "stop"
        if is_last:
            text, self.pending = self.pending + self.decoder.flush(), ""
            return text, "length"
        keep = held_suffix(self.pending, self.stop) if self.stop else 0
        text = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(text):]
        return text, None

    def drain(self) -> str:
        """Everything held back (stop-string look-ahead, incomplete UTF-8), when the request ends
        for another reason (a grammar that is complete)."""
        text, self.pending = self.pending + self.decoder.flush(), ""
        return text
