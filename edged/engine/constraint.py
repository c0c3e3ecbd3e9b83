"""Per-request constraint state: the grammar matcher and when its mask applies.

A request's constraint goes through phases, one generated token at a time:

  ACTIVE     the matcher's mask applies to every sampled token, which it then consumes;
  MAYBE_THINK  the first token of a template that may think: the mask is the grammar's plus the
             one `<think>` token; sampling it starts THINKING, anything else makes it ACTIVE;
  THINKING   free generation until the reasoning end (`start_after`) appears in the output;
  LAZY       free generation until a trigger text appears (llama.cpp's lazy grammars): the
             trigger and what followed it in the same tokens are fed to the matcher, re-tokenized
             (a special-token trigger as its id), and the constraint turns ACTIVE;
  OFF        a lazy trigger the grammar rejected: the rest stays free (the parser keeps the text
             as content), as a malformed call under tool_choice auto is.

The matcher belongs to the request: preemption by recompute leaves it as it is (the engine
only ever feeds it sampled tokens, once each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edged.structured import GrammarMatcher

ACTIVE, MAYBE_THINK, THINKING, LAZY, OFF = "active", "maybe_think", "thinking", "lazy", "off"


@dataclass(frozen=True)
class LazyTrigger:
    """Trigger text (bytes) and the tokens to feed the matcher for it (its special token id,
    or its text re-tokenized). at_start: only when the output (after reasoning) begins so."""

    text: bytes
    tokens: tuple[int, ...]
    at_start: bool = False


class RequestConstraint:
    """One sequence's constraint. token_bytes(id) gives a generated token's text bytes (special
    tokens as their text); encode(bytes) re-tokenizes for the matcher (no specials)."""

    def __init__(self, matcher: GrammarMatcher, token_bytes: Callable[[int], bytes],
                 encode: Callable[[bytes], list[int]], *, triggers: Sequence[LazyTrigger] = (),
                 start_after: bytes | None = None, starts_in_reasoning: bool = False,
                 think_token: int | None = None):
        self.matcher = matcher
        self._token_bytes = token_bytes
        self._encode = encode
        self.triggers = tuple(triggers)
        self.start_after = start_after
        self.think_token = think_token
        self._buf = b""  # output bytes since the phase began (THINKING, LAZY)
        self.error = ""
        if start_after is not None and starts_in_reasoning:
            self.phase = THINKING
        elif start_after is not None and think_token is not None:
            self.phase = MAYBE_THINK
        else:
            self.phase = self._after_reasoning()

    def _after_reasoning(self) -> str:
        return LAZY if self.triggers else ACTIVE

    @property
    def masking(self) -> bool:
        """Whether this step's token is sampled under the matcher's mask."""
        return self.phase in (ACTIVE, MAYBE_THINK)

    @property
    def extra_token(self) -> int | None:
        """A token allowed besides the grammar's (the `<think>` opener at the first token)."""
        return self.think_token if self.phase == MAYBE_THINK else None

    @property
    def stopped(self) -> bool:
        """The grammar is complete and nothing but EOS may follow: the request is done."""
        return self.phase == ACTIVE and self.matcher.is_stopped()

    def copy(self) -> "RequestConstraint":
        """An independent state for another choice of the same prompt (n > 1), not yet started."""
        c = RequestConstraint.__new__(RequestConstraint)
        c.__dict__.update(self.__dict__)
        c.matcher = self.matcher.copy()
        return c

    def consume(self, token: int) -> bool:
        """Advance past a sampled token; False (and `error`) when the constraint fails the request."""
        if self.phase == MAYBE_THINK:
            if token == self.think_token:
                self.phase = THINKING
                return True
            self.phase = ACTIVE
        if self.phase == ACTIVE:
            if self.matcher.consume(token):
                return True
            self.error = self.matcher.error or f"token {token} rejected by {self.matcher.constraint.field}"
            return False
        if self.phase in (THINKING, LAZY):
            self._buf += self._token_bytes(token)
            if self.phase == THINKING:
                return self._scan_reasoning_end()
            return self._scan_triggers()
        return True  # OFF

    def _scan_reasoning_end(self) -> bool:
        i = self._buf.find(self.start_after)
        if i < 0:
            return True
        rest = self._buf[i + len(self.start_after):]
        self._buf = b""
        self.phase = self._after_reasoning()
        if self.phase == LAZY:
            self._buf = rest
            return self._scan_triggers()
        return self._feed(list(self._encode(rest.lstrip())) if rest.strip() else [], lazy=False)

    def _scan_triggers(self) -> bool:
        lead = self._buf.lstrip()
        offset = len(self._buf) - len(lead)
        best = None
        for t in self.triggers:
            i = (offset if lead.startswith(t.text) else -1) if t.at_start else self._buf.find(t.text)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, t)
        if best is None:
            return True
        i, t = best
        rest = self._buf[i + len(t.text):]
        self._buf = b""
        return self._feed([*t.tokens, *(self._encode(rest) if rest else [])], lazy=True)

    def _feed(self, tokens: list[int], lazy: bool) -> bool:
        """Consume re-tokenized text; a lazy grammar that rejects it turns OFF (free text)."""
        self.phase = ACTIVE
        for tok in tokens:
            if not self.matcher.consume(tok):
                if lazy:
                    self.phase = OFF
                    return True
                self.error = self.matcher.error or "the output after the reasoning does not fit the grammar"
                return False
        return True


class ModelGrammars:
    """What constrained decoding keeps per loaded model: llguidance's tokenizer (built once, ~1 s
    on a 262k vocabulary: make this off any event loop) and the compiled-grammar cache."""

    def __init__(self, tokenizer, n_vocab: int | None = None):
        from edged.structured import MatcherCache, lltokenizer_for

        self.tokenizer = tokenizer
        width = max(n_vocab or 0, tokenizer.vocab_size)
        self.lltok = lltokenizer_for(tokenizer, n_vocab=width)
        self.cache = MatcherCache(self.lltok)

    def token_bytes(self, token: int) -> bytes:
        return self.tokenizer.token_bytes(token, False)

    def encode(self, data: bytes) -> list[int]:
        return list(self.lltok.tokenize_bytes(data))

    def special_id(self, text: str) -> int | None:
        """The id of `text` when it is one special token of the vocabulary, else None."""
        ids = self.tokenizer.encode(text, add_special=False, parse_special=True)
        if len(ids) == 1 and self.lltok.is_special_token(ids[0]):
            return ids[0]
        return None

    def token_ref(self, text: str) -> str | None:
        """llguidance's token reference (`<[id]>`) for a special-token literal, else None."""
        i = self.special_id(text)
        return None if i is None else f"<[{i}]>"

    def trigger(self, text: str, at_start: bool = False) -> LazyTrigger:
        i = self.special_id(text)
        tokens = (i,) if i is not None else tuple(self.encode(text.encode()))
        return LazyTrigger(text.encode(), tokens, at_start)

    def request_constraint(self, constraint, *, triggers: Sequence[LazyTrigger] = (),
                           start_after: str | None = None, starts_in_reasoning: bool = False,
                           think_opener: str | None = None) -> RequestConstraint:
        """A fresh constraint for one request (compiles the grammar on a cache miss: call it off
        the event loop); ConstraintError naming the field when the grammar is unusable."""
        matcher = self.cache.matcher(constraint)
        think = self.special_id(think_opener) if think_opener else None
        if think is None and think_opener:
            ids = self.tokenizer.encode(think_opener, add_special=False, parse_special=True)
            think = ids[0] if len(ids) == 1 else None
        return RequestConstraint(matcher, self.token_bytes, self.encode, triggers=triggers,
                                 start_after=start_after.encode() if start_after else None,
                                 starts_in_reasoning=starts_in_reasoning, think_token=think)
