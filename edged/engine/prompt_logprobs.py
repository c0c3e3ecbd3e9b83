"""Prompt log-probabilities: each prompt token's logprob, rank and top alternatives, computed from
the logits rows of the prefill pass itself (no second forward) and reduced as soon as the step
that made them ends, so no [prompt, vocab] block outlives one step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the sampled tokens' logprob code: prompt and output logprobs agree bit for bit
from edged.sampling import SamplingParams
from edged.sampling import _logprobs as token_logprobs

# a step's prompt-scoring logits rows are float32 [rows, vocab]: 128 MiB is 128 rows of a 262k
# vocabulary (Gemma 3; 512 rows would be 512 MiB), a whole 512-token step of a 32k one
SCORED_ROWS_BYTES = 128 << 20


def max_scored_rows(vocab_size: int, max_batch_tokens: int) -> int:
    """Prompt tokens one step may score: SCORED_ROWS_BYTES of logits, at least 16 rows."""
    return max(1, min(max_batch_tokens, max(16, SCORED_ROWS_BYTES // (4 * max(vocab_size, 1)))))


@dataclass
class PromptLogprob:
    """One prompt token as the model saw it from the tokens before it."""

    logprob: float  # log-softmax of the raw logits at the token
    rank: int  # 1 + the number of tokens with larger logits (1: the most likely)
    top: list[tuple[int, float]]  # the k most likely (token id, logprob), best first


def score_rows(block: np.ndarray, next_ids, k: int) -> list[PromptLogprob]:
    """block float32 [r, vocab]: logits rows of r consecutive positions; next_ids [r]: the
    prompt token each row predicts; k: alternatives per row (0..20)."""
    tokens = np.asarray(next_ids, dtype=np.int64)  # [r]
    params = [SamplingParams(logprobs=k)] * len(tokens)
    infos = token_logprobs(block, range(len(tokens)), tokens, params)
    out = []
    for i, t in enumerate(tokens):
        row = block[i]
        info = infos[i]
        rank = 1 + int(np.count_nonzero(row > row[t]))
        out.append(PromptLogprob(info.token_logprob, rank,
                                 list(zip(info.top_ids.tolist(), info.top_logprobs.tolist()))))
    return out


class PromptScores:
    """A request's prompt logprobs as its prefill chunks produce them (position 0 has none)."""

    def __init__(self, prompt_ids: list[int], k: int):
        self.prompt_ids = prompt_ids
        self.k = k
        self.entries: list[PromptLogprob | None] = [None] * len(prompt_ids)
        self.sent = False

    def add(self, block: np.ndarray, first_position: int) -> None:
        """Rows of positions first_position.. (each predicting the next prompt token); a
        recomputed chunk (after a preemption) overwrites the same entries with the same values."""
        r = block.shape[0]
        nxt = self.prompt_ids[first_position + 1 : first_position + 1 + r]
        for j, e in enumerate(score_rows(block, nxt, self.k)):
            self.entries[first_position + 1 + j] = e

    def take(self) -> list[PromptLogprob | None] | None:
        """The whole list, once (the first delta after the prefill carries it); then None."""
        if self.sent:
            return None
        self.sent = True
        return self.entries
