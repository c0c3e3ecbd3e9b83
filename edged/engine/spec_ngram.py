"""N-gram speculation without a draft model (llama.cpp's lookup, vLLM's ngram): a decoding
sequence's last n tokens (n = 3, 2, 1: longest first) are looked up in its own context (prompt and
output), and the tokens that followed their most recent earlier occurrence are the draft the
engine verifies in one forward pass (edged.engine.engine). Text that repeats the context (edits,
quotes, code) is drafted well; elsewhere the matches are short and mostly wrong, and its drafts
shrink to one token.

Each sequence keeps an index of its n-grams (n-gram -> most recent end position), extended
incrementally with the tokens it gained since the last lookup: a lookup costs the new tokens, not
the context. It also learns, per match length, how often its draft tokens are accepted, and drafts
only as far as a token is still likely enough to pay for its place in the step (DraftLength).
"""

from __future__ import annotations

import math

import numpy as np

MAX_NGRAM = 3  # longest n-gram looked up
# A draft token costs about this share of a one-token decode step where it is verified (on the
# CPU at c = 1: a step of 1 + k tokens takes ~1 + k / 4 one-token steps, the weights read once but
# multiplied k more times), so drafting on pays while P(every draft so far accepted) stays above it.
DRAFT_TOKEN_COST = 0.25
_DECAY = 0.8  # weight of the older outcomes at each new one: the estimate follows the text
_IDLE_DECAY = 0.95  # and at each step that drafts nothing: a new try about every 7 such steps


class NgramIndex:
    """One sequence's n-grams: maps[n - 1][key] = the end e of the latest n-gram tokens[e-n:e]
    that has a follower (e < len(tokens)). Keys pack the n token ids base `vocab`."""

    def __init__(self, vocab: int, max_n: int = MAX_NGRAM):
        self.vocab = vocab
        self.max_n = max_n
        self.maps: list[dict[int, int]] = [{} for _ in range(max_n)]
        self.next_end = 1  # the first end position not indexed yet

    def _key(self, gram) -> int:
        k = 0
        for t in gram:
            k = k * self.vocab + int(t)
        return k

    def extend(self, tokens: list[int]) -> None:
        """Index the n-grams ending at next_end .. len(tokens) - 1 (each has its follower)."""
        last = len(tokens) - 1
        lo = self.next_end
        if last < lo:
            return
        base = max(0, lo - self.max_n)
        a = np.asarray(tokens[base:last], dtype=np.int64)  # [last - base]: positions base..last-1
        v = np.int64(self.vocab)
        for n in range(1, self.max_n + 1):
            first = max(lo, n)  # ends first..last; the n-gram ending at e is a[e-n-base : e-base]
            if first > last:
                continue
            keys = np.zeros(last - first + 1, dtype=np.int64)  # [ends]
            for i in range(n):
                keys = keys * v + a[first - n + i - base : last - n + i + 1 - base]
            # later ends overwrite earlier ones: the map keeps the most recent occurrence
            self.maps[n - 1].update(zip(keys.tolist(), range(first, last + 1)))
        self.next_end = last + 1

    def match(self, tokens: list[int]) -> tuple[int, int]:
        """(n, e): the longest suffix n-gram that occurs earlier (n = max_n .. 1) and the end of
        its latest earlier occurrence (tokens[e] followed it); (0, 0) when none does."""
        self.extend(tokens)
        size = len(tokens)
        for n in range(min(self.max_n, size), 0, -1):
            e = self.maps[n - 1].get(self._key(tokens[size - n :]))
            if e is not None:
                return n, e
        return 0, 0

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the match's occurrence; [] when nothing matches."""
        n, e = self.match(tokens)
        return tokens[e : e + k] if n else []


class DraftLength:
    """How many tokens to draft after an n-gram match, per match length n: a = the chance a draft
    token is accepted (its previous ones were), from decayed counts of accepted tokens and of
    rejections with a Laplace prior; draft the k tokens with a^k >= DRAFT_TOKEN_COST, none while
    a < DRAFT_TOKEN_COST. Each step drafting nothing decays the counts too, so the estimate drifts
    back to the prior and a draft is tried again every few steps."""

    def __init__(self, max_n: int = MAX_NGRAM):
        self.accepted = [0.0] * max_n  # [n - 1]
        self.rejected = [0.0] * max_n

    def next_length(self, n: int, spec_max: int) -> int:
        """The length of this step's draft after a match of length n (0: none, counts decayed)."""
        acc, rej = self.accepted[n - 1], self.rejected[n - 1]
        a = (acc + 1.0) / (acc + rej + 2.0)
        if a < DRAFT_TOKEN_COST:
            self.accepted[n - 1], self.rejected[n - 1] = acc * _IDLE_DECAY, rej * _IDLE_DECAY
            return 0
        return max(1, min(spec_max, int(math.log(DRAFT_TOKEN_COST) / math.log(a))))

    def record(self, n: int, drafted: int, accepted: int) -> None:
        self.accepted[n - 1] = self.accepted[n - 1] * _DECAY + accepted
        self.rejected[n - 1] = self.rejected[n - 1] * _DECAY + (accepted < drafted)


class _Sequence:
    __slots__ = ("index", "length", "last_n")

    def __init__(self, vocab: int, max_n: int):
        self.index = NgramIndex(vocab, max_n)
        self.length = DraftLength(max_n)
        self.last_n = 0  # the match length of the last proposal (0: none)


class NgramProposer:
    """The drafts of every speculating sequence; each keeps its NgramIndex and DraftLength until
    released. `record` tells it how a request's last draft fared."""

    def __init__(self, vocab_size: int, spec_max: int = 8, max_n: int = MAX_NGRAM):
        if isinstance(spec_max, bool) or not isinstance(spec_max, int) or spec_max < 1:
            raise ValueError(f"spec_max must be an integer >= 1, got {spec_max!r}")
        if vocab_size < 1 or vocab_size ** max_n >= 2**63:
            raise ValueError(f"n-gram speculation packs {max_n} token ids in an int64 key: the "
                             f"vocabulary size must be in [1, 2^{63 // max_n}), got {vocab_size}")
        self.vocab_size = vocab_size
        self.spec_max = spec_max
        self.max_n = max_n
        self._seqs: dict[str, _Sequence] = {}

    def propose(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        """At most k draft tokens to follow `tokens` (the sequence's whole context): as many as
        DraftLength gives the match's n, up to spec_max."""
        if k < 1:
            return []
        seq = self._seqs.get(request_id)
        if seq is None:
            seq = self._seqs[request_id] = _Sequence(self.vocab_size, self.max_n)
        n, e = seq.index.match(tokens)
        seq.last_n = n
        if not n:
            return []
        return tokens[e : e + min(k, seq.length.next_length(n, self.spec_max))]

    def propose_batch(self, items: list[tuple[str, list[int], int]]) -> list[list[int]]:
        """propose for each (request id, tokens, k)."""
        return [self.propose(*item) for item in items]

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        """How many of the request's last proposed drafts were verified and how many accepted."""
        seq = self._seqs.get(request_id)
        if seq is not None and seq.last_n and drafted:
            seq.length.record(seq.last_n, drafted, accepted)

    def release(self, request_id: str) -> None:
        """Forget a finished request's index and estimates."""
        self._seqs.pop(request_id, None)


def draft_room(req, spec_max: int, max_len: int) -> int:
    """Drafts a decoding request may verify this step: each accepted one plus the bonus token
    must fit its max_tokens and the context (max_len); 0 while it still has a prompt to prefill."""
    if req.num_tokens - req.num_computed_tokens != 1 or req.pooling is not None:
        return 0
    return max(0, min(spec_max, req.max_tokens - req.num_output_tokens - 1, max_len - req.num_tokens - 1))
