"""Token sampling over a batch of logit rows.

Each row has its own :class:`SamplingParams` and its own ``np.random.Generator`` (seeded from the
request's seed and kept with the request), so a seeded request draws the same tokens whatever
else shares its batch. A sampled row applies, in llama.cpp's default sampler-chain order:

1. ``logit_bias`` (added to the logits),
2. penalties over the last ``repeat_last_n`` tokens of the row's history: repetition (llama.cpp
   style: positive logits divided by the penalty, negative ones multiplied), then
   ``frequency_penalty × count + presence_penalty × (count > 0)`` subtracted,
3. top-k, 4. top-p (nucleus, on the softmax of the surviving logits at temperature 1),
5. min-p (keep p ≥ min_p × p_max), 6. temperature, 7. one draw from the softmax of what is left.

``temperature == 0`` is greedy: the argmax after steps 1–2 (the filters never remove the argmax).
Requested log-probabilities are OpenAI's: the full-vocabulary log-softmax of the *raw* logits,
before bias, penalties and filters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.backends.cpu.sampling import draw_softmax, rows_scan, softmax_denominator, warm_up
from edged.sampling_params import MAX_LOGPROBS, SamplingParams

_F32_MAX = float(np.finfo(np.float32).max)

__all__ = ["SamplingParams", "TokenLogprobs", "Sampler", "sample", "make_rng", "MAX_LOGPROBS"]

_TOP_P_FIRST_BLOCK = 256  # top-p over a full row first tries the best 256 tokens, then 8× more


@dataclass
class TokenLogprobs:
    """Log-probabilities of one sampled position (full-vocabulary log-softmax of raw logits)."""

    token_logprob: float
    top_ids: np.ndarray  # int32 [N], most likely first
    top_logprobs: np.ndarray  # float32 [N]


def make_rng(params: SamplingParams) -> np.random.Generator:
    """The generator a request keeps for its whole life: seeded from ``params.seed`` if set."""
    return np.random.default_rng(params.seed)


# ---------------------------------------------------------------------------------------------

def _adjusted_row(row: np.ndarray, p: SamplingParams, history: Any, vocab: int) -> np.ndarray:
    """Row after logit_bias and penalties (a copy only when something changes)."""
    if not p.logit_bias and not p.has_penalties:
        return row
    row = row.astype(np.float32, copy=True)
    if p.logit_bias:
        ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
        if ids.max() >= vocab:
            raise ValueError(f"logit_bias token id {int(ids.max())} is outside the vocabulary ({vocab})")
        row[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float32, count=len(ids))
    if p.has_penalties and history is not None and len(history):
        h = np.asarray(history)
        if p.repeat_last_n > 0:
            h = h[-p.repeat_last_n:]
        ids, counts = np.unique(h.astype(np.int64, copy=False), return_counts=True)
        if ids[0] < 0 or ids[-1] >= vocab:
            raise ValueError(f"history token ids must be in [0, {vocab})")
        vals = row[ids]
        if p.repetition_penalty != 1.0:
            # a penalty near 0 (5e-324 passes its (0, 10] check) must not leave a logit at inf
            with np.errstate(over="ignore", divide="ignore"):
                vals = np.where(vals <= 0, vals * p.repetition_penalty, vals / p.repetition_penalty)
            np.clip(vals, -_F32_MAX, _F32_MAX, out=vals)
        vals = vals - (counts * p.frequency_penalty + p.presence_penalty).astype(np.float32)
        row[ids] = vals
    return row


def _top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values (unordered). A threshold from a strided sample removes most
    of a large row with one comparison first; exact, since the top k all pass any threshold that
    at least k values pass."""
    v = row.shape[0]
    if k >= v:
        return np.arange(v)
    if v >= 16384 and k * 64 <= v:
        sub = row[::32]
        r = min(sub.shape[0], k // 8 + 8)  # expect ~4k full-row values above the guess
        guess = np.partition(sub, sub.shape[0] - r)[sub.shape[0] - r]
        above = np.flatnonzero(row > guess)
        if above.shape[0] >= k:
            c = above.shape[0]
            return above[np.argpartition(row[above], c - k)[c - k:]]
        # Fewer than k values above the guess: if the guess itself is the k-th largest value,
        # fill with its ties (argpartition is slow on long runs of equal values, e.g. masked logits).
        ties = np.flatnonzero(row == guess)
        if above.shape[0] + ties.shape[0] >= k:
            return np.concatenate([above, ties[: k - above.shape[0]]])
    return np.argpartition(row, v - k)[v - k:]


def _draw(w: np.ndarray, u: float) -> int:
    """Index i drawn with probability w[i] / sum(w) for u uniform in [0, 1); w float32 >= 0.
    Large rows go through 1024-wide block sums, so no full-length cumulative sum is built."""
    n = w.shape[0]
    block = 1024
    if n <= 4 * block:
        cdf = np.cumsum(w, dtype=np.float64)
        j = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), n - 1)
    else:
        nb = -(-n // block)
        wp = w if nb * block == n else np.concatenate([w, np.zeros(nb * block - n, np.float32)])
        cb = np.cumsum(wp.reshape(nb, block).sum(axis=1, dtype=np.float64))
        target = u * cb[-1]
        b = min(int(np.searchsorted(cb, target, side="right")), nb - 1)
        inner = np.cumsum(wp[b * block:(b + 1) * block], dtype=np.float64)
        rem = target - (cb[b - 1] if b else 0.0)
        j = b * block + min(int(np.searchsorted(inner, rem, side="right")), block - 1)
        j = min(j, n - 1)
    if w[j] <= 0:  # rounding pushed the draw onto a zero-weight slot: take the last live one before
        live = np.flatnonzero(w[: j + 1] > 0)
        j = int(live[-1]) if live.size else int(np.flatnonzero(w > 0)[0])
    return j


def _top_p_full(row: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Smallest most-likely set of a full row whose probability reaches top_p, without sorting the
    whole row: sort the best m tokens, and grow m only if they fall short."""
    v = row.shape[0]
    mx = float(row.max())
    total = softmax_denominator(row, np.float32(mx), np.float32(1.0))
    m = min(_TOP_P_FIRST_BLOCK, v)
    while True:
        ids = _top_k_ids(row, m)
        ids = ids[np.argsort(-row[ids], kind="stable")]
        vals = row[ids]
        cum = np.cumsum(np.exp(vals.astype(np.float64) - mx)) / total
        hit = int(np.searchsorted(cum, top_p, side="left"))
        if hit < m or m == v:
            n = min(hit + 1, m)
            return ids[:n], vals[:n]
        m = min(m * 8, v)


def _sample_row(row: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """One draw from ``row`` (already biased/penalized) through top-k → top-p → min-p → temperature."""
    v = row.shape[0]
    ids: np.ndarray | None = None  # None: every token is still a candidate
    vals = row
    k = p.top_k
    if 0 < k < v:
        ids = _top_k_ids(row, k)
        vals = row[ids]
    if p.top_p < 1.0:
        if ids is None:
            ids, vals = _top_p_full(row, p.top_p)
        else:
            order = np.argsort(-vals, kind="stable")
            ids, vals = ids[order], vals[order]
            probs = np.exp(vals.astype(np.float64) - float(vals[0]))
            cum = np.cumsum(probs) / probs.sum()
            n = min(int(np.searchsorted(cum, p.top_p, side="left")) + 1, len(ids))
            ids, vals = ids[:n], vals[:n]
    mx = float(vals.max())
    if p.min_p > 0.0:
        keep = vals >= np.float32(mx + math.log(p.min_p))  # p_i >= min_p * p_max, in logit space
        if ids is None:
            ids = np.flatnonzero(keep)
            vals = row[ids]
        else:
            ids, vals = ids[keep], vals[keep]
    # Temperature scales only what survived the filters. A temperature whose inverse overflows
    # float32 (1e-40) is greedy among them: the largest finite scale, never 0 * inf = NaN.
    inv_t = np.float32(min(1.0 / p.temperature, _F32_MAX))
    if ids is None:  # the whole row: one fused pass, no [V] temporaries
        return int(draw_softmax(row, np.float32(mx), inv_t, rng.random()))
    w = np.exp((vals - np.float32(mx)) * inv_t)
    j = _draw(w, rng.random())
    return int(ids[j])


def _logprobs(logits: np.ndarray, rows: list[int], tokens: np.ndarray,
              params: Sequence[SamplingParams]) -> dict[int, TokenLogprobs]:
    out = {}
    for i in rows:
        n = params[i].logprobs
        row = logits[i]  # [V] view
        mx = np.float32(row.max())
        den = softmax_denominator(row, mx, np.float32(1.0))  # >= 1 for a row with a finite max
        lse = float(mx) + math.log(den) if den > 0 else float(mx)
        if n:
            top = _top_k_ids(row, n)
            top = top[np.argsort(-row[top], kind="stable")]
            top_lp = (row[top].astype(np.float64) - lse).astype(np.float32)
        else:
            top = np.empty(0, dtype=np.int32)
            top_lp = np.empty(0, dtype=np.float32)
        out[i] = TokenLogprobs(float(row[tokens[i]]) - lse, top.astype(np.int32), top_lp)
    return out


def sample(logits: np.ndarray, params: Sequence[SamplingParams],
           histories: Sequence[Any] | None = None,
           rngs: Sequence[np.random.Generator | None] | None = None,
           argmax: np.ndarray | None = None,
           ) -> tuple[np.ndarray, list[TokenLogprobs | None]]:
    """Sample one token per row.

    logits: float32 [n, V]. params: n SamplingParams. histories: n token-id sequences (or None)
    that the penalties look at — the caller decides whether the prompt is included (llama.cpp
    feeds it, OpenAI's presence/frequency penalties count generated tokens only). rngs: n
    generators, one per request (see :func:`make_rng`); may be None for greedy rows. argmax: int [n],
    each row's argmax when the caller already has it (backends/cpu/sampling.rows_scan of these logits).

    Returns token ids int32 [n] and, per row, TokenLogprobs when ``params[i].logprobs`` is not None.
    """
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[0] != len(params) or logits.shape[1] == 0:
        raise ValueError(f"logits must be [n, V] with n = len(params) = {len(params)}, got {logits.shape}")
    # float32 C-contiguous rows: what the row kernels are compiled for (no copy when already so)
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    n, vocab = logits.shape
    if histories is not None and len(histories) != n:
        raise ValueError(f"histories must have {n} entries, got {len(histories)}")
    if rngs is not None and len(rngs) != n:
        raise ValueError(f"rngs must have {n} entries, got {len(rngs)}")
    tokens = np.empty(n, dtype=np.int32)

    plain_greedy = [i for i, p in enumerate(params)
                    if p.greedy and not p.logit_bias and not p.has_penalties]
    if len(plain_greedy) == n:
        # Every row greedy with nothing to adjust (the common serving case): one argmax
        # over the batch in place, no copy of the [n, V] logits; a row holding NaN or inf takes
        # numpy's argmax (NaN first), which the check below then refuses or keeps as before.
        if argmax is None:
            argmax, finite = rows_scan(logits)
            for r in np.flatnonzero(~finite):
                argmax[r] = logits[r].argmax()
        tokens[:] = argmax
        if not np.isfinite(logits[np.arange(n), tokens]).all():
            raise ValueError("logits contain NaN or are all -inf")
    elif plain_greedy:
        # argmax of each row's view: a fancy-indexed sub-array would copy 1 MB per 262k-vocab row
        best = np.fromiter((logits[i].argmax() for i in plain_greedy), dtype=np.int64,
                           count=len(plain_greedy))
        if not np.isfinite(logits[plain_greedy, best]).all():
            raise ValueError("logits contain NaN or are all -inf")
        tokens[plain_greedy] = best
    done = set(plain_greedy)
    for i, p in enumerate(params):
        if i in done:
            continue
        row = _adjusted_row(logits[i], p, histories[i] if histories is not None else None, vocab)
        if p.greedy:
            tokens[i] = int(row.argmax())
            if not math.isfinite(float(row[tokens[i]])):
                raise ValueError(f"logits of row {i} contain NaN or are all -inf")
            continue
        if not math.isfinite(float(row.max())):
            raise ValueError(f"logits of row {i} contain NaN or +inf or are all -inf")
        rng = rngs[i] if rngs is not None else None
        if rng is None:
            raise ValueError(f"row {i} samples with temperature > 0 and needs a random generator")
        tokens[i] = _sample_row(row, p, rng)

    infos: list[TokenLogprobs | None] = [None] * n
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    if want:
        for i, lp in _logprobs(logits, want, tokens, params).items():
            infos[i] = lp
    return tokens, infos


class Sampler:
    """Keeps one random generator per request id, so seeded requests reproduce across steps."""

    def __init__(self) -> None:
        self._rngs: dict[Any, np.random.Generator] = {}

    def sample(self, logits: np.ndarray, request_ids: Sequence[Any],
               params: Sequence[SamplingParams], histories: Sequence[Any] | None = None,
               argmax: np.ndarray | None = None) -> tuple[np.ndarray, list[TokenLogprobs | None]]:
        """Like :func:`sample`, creating each request's generator from its seed on first use."""
        rngs = []
        for rid, p in zip(request_ids, params, strict=True):
            rng = self._rngs.get(rid)
            if rng is None:
                rng = self._rngs[rid] = make_rng(p)
            rngs.append(rng)
        return sample(logits, params, histories, rngs, argmax)

    def warm_up(self) -> None:
        """Compile (or load from the on-disk cache) the sampling kernels now, not inside the
        first sampled request's step."""
        warm_up()

    def release(self, request_id: Any) -> None:
        """Forget a finished request's generator."""
        self._rngs.pop(request_id, None)
