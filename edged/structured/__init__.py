"""Constrained decoding with llguidance: request forms -> grammar -> one matcher per sequence ->
per-step allowed-token bitmasks applied to the logits before sampling.

    lltok = lltokenizer_for(tokenizer, n_vocab=logits_width)    # once per model, kept
    c = constraint_from_request(body)                          # ConstraintError(field, msg) -> 400
    m = cache.matcher(c) if c else None                        # MatcherCache(lltok): compiled once
                                                               # per grammar; ConstraintError too
    fut = computer.submit(n_rows, [(row, m), ...])             # while the forward pass runs
    batch = fut.result(); batch.apply(logits); ...sample...; m.consume(token)
"""

from edged.structured.cache import MatcherCache
from edged.structured.errors import ConstraintError
from edged.structured.forms import (
    Constraint,
    choice_constraint,
    constraint_from_request,
    grammar_constraint,
    regex_constraint,
    response_format_constraint,
    schema_constraint,
    structured_outputs_constraint,
)
from edged.structured.json_grammar import MAX_WHITESPACE_RUN, WHITESPACE_PATTERN, json_schema_grammar
from edged.structured.mask import MaskBatch, MaskComputer, allocate_bitmask
from edged.structured.matcher import DEFAULT_LIMITS, GrammarMatcher, check_constraint, new_matcher
from edged.structured.tokenizer import build_lltokenizer, llg_token_bytes, lltokenizer_for

__all__ = [
    "ConstraintError", "Constraint", "constraint_from_request", "response_format_constraint",
    "structured_outputs_constraint", "schema_constraint", "regex_constraint", "choice_constraint",
    "grammar_constraint", "json_schema_grammar", "WHITESPACE_PATTERN", "MAX_WHITESPACE_RUN",
    "GrammarMatcher", "new_matcher", "check_constraint", "DEFAULT_LIMITS", "MaskComputer", "MaskBatch",
    "allocate_bitmask", "MatcherCache", "build_lltokenizer", "lltokenizer_for", "llg_token_bytes",
]
