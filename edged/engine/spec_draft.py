"""Speculation with a draft model (llama.cpp's -md, vLLM's draft models): a smaller model with the
target's vocabulary greedily proposes the next tokens of a decoding sequence, and the engine
verifies them in one forward pass of the target (edged.engine.engine), which keeps the outputs
exactly those of decoding without drafts (a greedy draft is a one-token proposal). The step's
decoding sequences are drafted together: each draft pass carries one token of every sequence
still drafting.

The draft keeps its own paged KV cache, one pool shared by the sequences, each holding the tokens
it last saw: at each proposal the draft forgets what the target rejected (the common prefix with
the sequence's context stays), reads the tokens it has not seen in one pass, and then proposes one
token a pass. It can stop early where its own top probability falls below p_min (--draft-p-min):
such a token is likely rejected and costs a draft pass and a verified row.
"""

from __future__ import annotations

import numpy as np

from edged.backends.base import Batch

# --draft-p-min's default: never stop early. llama.cpp's 0.8 (0.75 here) took a 135M draft's speedup
# from 1.66x to 1.0x: so small a model is rarely that sure, yet usually right (docs/SERVER.md)
P_MIN = 0.0
CATCH_UP_CHUNK = 512  # tokens the draft reads per pass when it catches up with a context


class VocabularyMismatch(ValueError):
    pass


def check_same_vocabulary(target, draft) -> None:
    """Raise VocabularyMismatch unless the two tokenizers (edged.tokenizer.Tokenizer) have the same
    kind, token texts and begin / end ids: a draft token id must mean the target's token."""
    a, b = target.vocab, draft.vocab
    if a.model != b.model:
        raise VocabularyMismatch(f"the draft model's tokenizer is {b.model!r}, the target's {a.model!r}")
    if len(a.tokens) != len(b.tokens):
        raise VocabularyMismatch(f"the draft model has {len(b.tokens)} tokens, the target {len(a.tokens)}")
    if a.tokens != b.tokens:
        i = next(i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y)
        raise VocabularyMismatch(f"token {i} is {b.tokens[i]!r} in the draft model, {a.tokens[i]!r} in the target")
    if (target.bos_id, tuple(target.eos_ids)) != (draft.bos_id, tuple(draft.eos_ids)):
        raise VocabularyMismatch("the draft model's begin / end-of-text tokens differ from the target's")


class _Sequence:
    __slots__ = ("blocks", "seen", "known")

    def __init__(self):
        self.blocks: list[int] = []  # the pool's blocks holding this sequence's draft KV, in order
        self.seen: list[int] = []  # tokens whose KV the draft holds, at positions 0..len - 1
        self.known = 0  # seen[:known] is the context's start (a context only grows): not compared again


class DraftModelProposer:
    """The drafts of every speculating sequence from `draft` (a model: forward, allocate_kv,
    context_length), whose KV pool holds `pool_tokens` tokens in blocks of `block_size`. Same interface
    as spec_ngram.NgramProposer: propose, record, release, spec_max."""

    def __init__(self, draft, spec_max: int, pool_tokens: int, block_size: int = 16, p_min: float = P_MIN):
        if isinstance(spec_max, bool) or not isinstance(spec_max, int) or spec_max < 1:
            raise ValueError(f"spec_max must be an integer >= 1, got {spec_max!r}")
        self.draft = draft
        self.spec_max = spec_max
        self.block_size = block_size
        self.p_min = p_min
        self.context_length = draft.context_length  # positions past it: no drafts
        num_blocks = -(-pool_tokens // block_size)
        self.kv = draft.allocate_kv(num_blocks, block_size)
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() gives the lowest id
        self._seqs: dict[str, _Sequence] = {}
        self.passes = 0  # draft forward passes run (tests and benchmarks read it)

    @property
    def kv_bytes(self) -> int:
        """Bytes of the draft's KV pool."""
        return sum(layer.nbytes for layer in self.kv)

    def propose(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        """At most k greedy draft tokens to follow `tokens` (the sequence's whole context)."""
        return self.propose_batch([(request_id, tokens, k)])[0]

    def propose_batch(self, items: list[tuple[str, list[int], int]]) -> list[list[int]]:
        """Each (request id, whole context, k)'s drafts, the sequences' passes batched: at most k
        greedy tokens; [] where k < 1 or the pool cannot hold the sequence (its state then dropped)."""
        out: list[list[int]] = [[] for _ in items]
        limits = [min(k, self.context_length - len(tokens)) for _, tokens, k in items]  # drafts each may get
        pending: list[tuple[int, _Sequence, list[int]]] = []  # (item, sequence, tokens to read)
        for i, (rid, tokens, _) in enumerate(items):
            k = limits[i]
            if k < 1 or not tokens:
                continue
            seq = self._seqs.get(rid)
            if seq is None:
                seq = self._seqs[rid] = _Sequence()
            known = min(seq.known, len(tokens))
            keep = known + _common_prefix(seq.seen[known:], tokens[known:])
            keep = min(keep, len(tokens) - 1)  # the last token is read again: its logits give draft 1
            del seq.seen[keep:]
            seq.known = len(tokens)
            if not self._reserve(seq, len(tokens) + k - 1):
                self.release(rid)
                continue
            pending.append((i, seq, tokens[keep:]))
        rows = self._catch_up(pending)  # item -> logits [vocab] after its context
        while rows:
            step = []
            for i, row in rows.items():
                t = int(np.argmax(row))
                if _top_probability(row, t) < self.p_min:
                    continue
                out[i].append(t)
                if len(out[i]) < limits[i]:
                    step.append((i, self._seqs[items[i][0]], [t]))
            rows = self._pass(step) if step else {}
        return out

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        """Nothing to learn: the next proposal compares the draft's tokens with the context."""

    def release(self, request_id: str) -> None:
        """Give a finished request's draft blocks back to the pool."""
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self._free.extend(reversed(seq.blocks))

    def _reserve(self, seq: _Sequence, tokens: int) -> bool:
        """Blocks for `tokens` positions; False (nothing taken) when the pool is short."""
        need = -(-tokens // self.block_size) - len(seq.blocks)
        if need > len(self._free):
            return False
        for _ in range(need):
            seq.blocks.append(self._free.pop())
        return True

    def _catch_up(self, pending: list[tuple[int, _Sequence, list[int]]]) -> dict[int, np.ndarray]:
        """Read each sequence's unseen tokens, several sequences a pass and at most CATCH_UP_CHUNK
        tokens a pass (a long context over several); each item's logits after its last token."""
        rows: dict[int, np.ndarray] = {}
        batch, size = [], 0
        for i, seq, ids in pending:
            for start in range(0, len(ids), CATCH_UP_CHUNK):
                part = ids[start : start + CATCH_UP_CHUNK]
                if size + len(part) > CATCH_UP_CHUNK:
                    rows.update(self._pass(batch))
                    batch, size = [], 0
                # only a sequence's last part wants logits: an earlier one's item id is None
                batch.append((i if start + CATCH_UP_CHUNK >= len(ids) else None, seq, part))
                size += len(part)
        if batch:
            rows.update(self._pass(batch))
        return rows

    def _pass(self, segments: list[tuple[int | None, _Sequence, list[int]]]) -> dict[int, np.ndarray]:
        """One draft forward pass over the segments (item, sequence, ids: added at positions
        len(seen)..); the logits [vocab] after each segment whose item is not None."""
        bs = self.block_size
        ids = [t for _, _, part in segments for t in part]
        pos = np.concatenate([np.arange(len(q.seen), len(q.seen) + len(p), dtype=np.int32)
                              for _, q, p in segments])  # [n]
        starts = np.cumsum([0] + [len(p) for _, _, p in segments], dtype=np.int64).astype(np.int32)  # [s + 1]
        tables = np.full((len(segments), max(len(q.blocks) for _, q, _ in segments)), -1, np.int32)  # [s, blocks]
        for r, (_, q, _) in enumerate(segments):
            tables[r, : len(q.blocks)] = q.blocks
        seg = np.repeat(np.arange(len(segments)), np.diff(starts))  # [n]: each token's segment
        want = [r for r, (i, _, _) in enumerate(segments) if i is not None]
        batch = Batch(token_ids=np.asarray(ids, dtype=np.int32), positions=pos, seq_starts=starts,
                      seq_lens=np.array([len(q.seen) + len(p) for _, q, p in segments], dtype=np.int32),
                      block_tables=tables, slot_mapping=tables[seg, pos // bs] * bs + pos % bs,
                      logits_indices=(starts[1:] - 1)[want].astype(np.int32), block_size=bs)
        logits = self.draft.forward(batch, self.kv)  # [len(want), vocab]
        for _, q, p in segments:
            q.seen.extend(p)
        self.passes += 1
        return {segments[r][0]: logits[j] for j, r in enumerate(want)}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _top_probability(row: np.ndarray, top: int) -> float:
    """softmax(row)[top] for the row's largest logit `top` (row float32 [vocab])."""
    return float(1.0 / np.exp(row - row[top], dtype=np.float64).sum())


def load_draft(name: str, target_tokenizer, **load_options):
    """The draft model `name` (a .gguf path or a store name, as edged.loader.load takes it), loaded
    with load_options and checked against the target's tokenizer (VocabularyMismatch): an
    edged.loader.LoadedModel (the engine takes its .model)."""
    from edged.loader import load

    lm = load(name, **load_options)
    try:
        check_same_vocabulary(target_tokenizer, lm.tokenizer)
    except VocabularyMismatch as e:
        raise VocabularyMismatch(f"draft model {name}: {e}") from None
    return lm
