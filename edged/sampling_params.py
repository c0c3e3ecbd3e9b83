"""Per-request sampling settings (:class:`SamplingParams`), validated on construction; what
each setting does is in edged.sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit


def _finite(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _integer(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return int(v)


@dataclass
class SamplingParams:
    """Per-request sampling settings, validated on construction (ValueError on bad values).

    temperature: 0 = greedy, else > 0 (≤ 100). top_k: 0 or -1 = off. top_p in (0, 1]; min_p in
    [0, 1]. repetition_penalty > 0 (1 = off), presence/frequency_penalty in [-2, 2] (OpenAI's
    range), applied over the last ``repeat_last_n`` history tokens (-1 = whole history, 0 = off;
    llama.cpp's default 64). logit_bias: token id → bias in [-100, 100]. seed: None = fresh
    entropy. logprobs: None = none, 0 = the chosen token's, N ≤ 20 = also the top N.
    prompt_logprobs: the same for every prompt token (computed in the prefill). max_tokens:
    None = until a stop condition, 0 = prefill only (prompt logprobs, no token). stop: up to 16 strings; stop_token_ids: extra ids that end
    generation; ignore_eos: keep going past EOS. speculative: False opts this request out of the
    engine's speculative decoding (its outputs are the same either way; only the speed differs).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    speculative: bool = True

    def __post_init__(self) -> None:
        self.temperature = _finite("temperature", self.temperature)
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        self.top_k = _integer("top_k", self.top_k)
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or a positive count, got {self.top_k}")
        self.top_p = _finite("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.min_p = _finite("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        self.repetition_penalty = _finite("repetition_penalty", self.repetition_penalty)
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = _finite(name, getattr(self, name))
            if not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v}")
            setattr(self, name, v)
        self.repeat_last_n = _integer("repeat_last_n", self.repeat_last_n)
        if self.repeat_last_n < -1:
            raise ValueError(f"repeat_last_n must be -1 (all), 0 (off) or positive, got {self.repeat_last_n}")
        if not isinstance(self.logit_bias, dict):
            raise ValueError("logit_bias must be a mapping of token id to bias")
        bias = {}
        for k, v in self.logit_bias.items():
            # JSON object keys arrive as strings ("50256"): accept decimal strings too.
            if isinstance(k, str) and k.strip().lstrip("-").isdigit():
                k = int(k)
            k = _integer("logit_bias token id", k)
            if k < 0:
                raise ValueError(f"logit_bias token id must be >= 0, got {k}")
            v = _finite(f"logit_bias[{k}]", v)
            if not -100.0 <= v <= 100.0:
                raise ValueError(f"logit_bias[{k}] must be in [-100, 100], got {v}")
            bias[k] = v
        self.logit_bias = bias
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if not 0 <= self.seed < 2**64:
                raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None:
                v = _integer(name, v)
                if not 0 <= v <= MAX_LOGPROBS:
                    raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {v}")
                setattr(self, name, v)
        if self.max_tokens is not None:
            self.max_tokens = _integer("max_tokens", self.max_tokens)
            if self.max_tokens < 0:
                raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stop) > 16 or not all(isinstance(s, str) and s for s in stop):
            raise ValueError("stop must be a non-empty string or a list of up to 16 non-empty strings")
        self.stop = stop
        ids = tuple(_integer("stop_token_ids", t) for t in (self.stop_token_ids or ()))
        if any(t < 0 for t in ids):
            raise ValueError("stop_token_ids must be >= 0")
        self.stop_token_ids = ids
        self.ignore_eos = bool(self.ignore_eos)
        if not isinstance(self.speculative, bool):
            raise ValueError(f"speculative must be true or false, got {self.speculative!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0)
