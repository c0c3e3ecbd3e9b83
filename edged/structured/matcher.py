"""One grammar matcher per constrained sequence (a thin, never-raising wrapper over LLMatcher).

The matcher belongs to the request and lives as long as it: preemption by recompute rebuilds the
KV cache from the request's tokens but leaves the matcher, which has already consumed the same
generated tokens, as it is. `copy()` forks it (n > 1 from one prompt); `rollback(k)` undoes the
last k tokens (a stop string trimmed, a rejected draft token).

Errors (a token the grammar rejects, a lexer/parser limit hit mid-generation) never raise: the
matcher enters llguidance's error state, `error` says why, and the engine fails that request.
"""

from __future__ import annotations

import numpy as np
import llguidance as llg

from edged.structured.errors import ConstraintError
from edged.structured.forms import Constraint

# llguidance's defaults, without parser state and grammar text in error messages (those go to clients)
DEFAULT_LIMITS = llg.LLParserLimits(verbose_errors=False)
_MAX_ERROR_CHARS = 600


def _short(msg: str) -> str:
    return msg if len(msg) <= _MAX_ERROR_CHARS else msg[:_MAX_ERROR_CHARS] + " ..."


class GrammarMatcher:
    """The grammar state of one sequence. Build with `new_matcher` (validates the grammar)."""

    def __init__(self, matcher: llg.LLMatcher, lltok: llg.LLTokenizer, constraint: Constraint):
        self._m = matcher
        self.lltok = lltok
        self.constraint = constraint
        self.vocab_size = lltok.vocab_size
        self.mask_words = (lltok.vocab_size + 31) // 32  # int32 words per bitmask row
        self.n_consumed = 0
        self._error = ""

    @property
    def llmatcher(self) -> llg.LLMatcher:
        """The llguidance matcher (for LLExecutor batch calls)."""
        return self._m

    def fill_mask(self, bitmask: np.ndarray, row: int = 0) -> None:
        """Writes the allowed next tokens into bitmask[row] (int32 words, bit t%32 of word t//32).

        Drops the GIL. Never call while `consume`/`rollback` runs on this matcher in another thread.
        """
        if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[1] != self.mask_words:
            raise ValueError(f"bitmask must be int32 [n, {self.mask_words}], not {bitmask.dtype} {bitmask.shape}")
        if not bitmask.flags["C_CONTIGUOUS"]:
            raise ValueError("bitmask must be C-contiguous")
        v = bitmask[row]
        self._m.unsafe_compute_mask_ptr(v.ctypes.data, v.nbytes)

    def consume(self, token: int) -> bool:
        """Advances past the sampled token; False (and `error` set) when the grammar rejects it."""
        ok = self._m.consume_token(int(token))
        if ok:
            self.n_consumed += 1
        return ok

    def rollback(self, n: int) -> bool:
        """Undoes the last `n` consumed tokens."""
        if n <= 0:
            return True
        ok = self._m.rollback(int(n))
        if ok:
            self.n_consumed -= n
        return ok

    def copy(self) -> "GrammarMatcher":
        """An independent matcher in the same state."""
        c = GrammarMatcher(self._m.deep_copy(), self.lltok, self.constraint)
        c.n_consumed = self.n_consumed
        return c

    def is_error(self) -> bool:
        return self._m.is_error()

    @property
    def error(self) -> str:
        """Why the matcher failed ("" while it has not)."""
        return _short(self._m.get_error()) if self._m.is_error() else ""

    def is_accepting(self) -> bool:
        """The output so far is a complete document (EOS is allowed now)."""
        return self._m.is_accepting()

    def is_stopped(self) -> bool:
        """Nothing but EOS can follow (the document is complete and cannot grow), or error."""
        return self._m.is_stopped()

    def stop_reason(self) -> str:
        return self._m.stop_reason()

    def forced_bytes(self) -> bytes:
        """Bytes the grammar forces next (e.g. after `{"na` of a one-key schema)."""
        return self._m.compute_ff_bytes()

    def __repr__(self) -> str:
        state = "error" if self.is_error() else "stopped" if self.is_stopped() else "running"
        return f"GrammarMatcher({self.constraint.kind} from {self.constraint.field}, {self.n_consumed} tokens, {state})"


def new_matcher(constraint: Constraint, lltok: llg.LLTokenizer,
                limits: llg.LLParserLimits | None = None) -> GrammarMatcher:
    """Compiles the constraint's grammar for this tokenizer; ConstraintError naming the field when
    it does not compile or exceeds the limits. Drops the GIL while compiling (up to ~1 s for very
    large schemas): the server should call this off its event loop, before queueing the request."""
    m = llg.LLMatcher(lltok, constraint.grammar, log_level=0, limits=limits or DEFAULT_LIMITS)
    if m.is_error():
        raise ConstraintError(constraint.field, _short(m.get_error()))
    return GrammarMatcher(m, lltok, constraint)


def check_constraint(constraint: Constraint, lltok: llg.LLTokenizer | None = None,
                     limits: llg.LLParserLimits | None = None) -> None:
    """Validates without keeping a matcher (also works without a tokenizer)."""
    is_err, msgs = llg.LLMatcher.validate_grammar_with_warnings(
        constraint.grammar, lltok, limits=limits or DEFAULT_LIMITS)
    if is_err:
        raise ConstraintError(constraint.field, _short(msgs[0] if msgs else "invalid grammar"))
