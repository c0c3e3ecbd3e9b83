"""A generation request as the scheduler sees it: token ids and how many have KV computed."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Prompt plus generated ids in one list; `num_computed_tokens` of them have KV in the pool.

    Prefill and decode are the same thing here: each step computes some of the uncomputed tokens.
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: Any = None  # edged.sampling.SamplingParams (opaque to the scheduler)
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: Status = Status.WAITING
    arrival_time: float = field(default_factory=time.monotonic)
    num_preemptions: int = 0
    finish_reason: str | None = None
    # score every prompt token (logprob + this many alternatives) during prefill; None: no
    prompt_logprobs: int | None = None
    prompt_scored: bool = False  # the prompt's prefill has run to its end once (scores complete)
    pooling: str | None = None  # an embedding request ("mean", "last", "cls"): prefill only, no KV kept
    # draft tokens this step verifies after token_ids (edged.engine.spec_ngram); not in token_ids
    spec_tokens: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_ids) + self.max_tokens

    @property
    def scoring(self) -> bool:
        """Prompt positions still to score: each step's chunk wants a logits row per token."""
        return self.prompt_logprobs is not None and not self.prompt_scored

    @property
    def needs_every_row(self) -> bool:
        """Every prompt position must be computed here (scored or pooled): no cached-prefix reuse,
        whose positions never had their logits or hidden states computed."""
        return self.pooling is not None or self.scoring
