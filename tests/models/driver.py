"""Test-side driver for models: flat paged batches, a trivial block allocator, greedy decoding.

The engine's scheduler and block pool replace all of this in production; here it only needs to
produce valid Batch objects (non-contiguous block ids on purpose).
"""

import time
from dataclasses import dataclass, field

import numpy as np

from edged.backends.base import Batch


class ShuffledBlocks:
    """Hands out block ids in a fixed random order, so sequences get non-contiguous blocks."""

    def __init__(self, num_blocks: int, seed: int = 0):
        self.free = list(np.random.default_rng(seed).permutation(num_blocks))

    def take(self) -> int:
        return int(self.free.pop())


@dataclass
class Seq:
    """One sequence's context: its block table grows as tokens are added."""

    blocks: list = field(default_factory=list)
    length: int = 0  # tokens whose KV is stored


def make_batch(seqs: list[Seq], chunks: list, alloc: ShuffledBlocks, block_size: int,
               all_logits: bool = False) -> Batch:
    """Append chunk i (a list of token ids) to seqs[i]; logits for each chunk's last token (or all)."""
    ids, pos, slots, starts, lens, logit_rows = [], [], [], [0], [], []
    for s, chunk in zip(seqs, chunks):
        for t in chunk:
            if s.length % block_size == 0 and s.length // block_size == len(s.blocks):
                s.blocks.append(alloc.take())
            p = s.length
            ids.append(t)
            pos.append(p)
            slots.append(s.blocks[p // block_size] * block_size + p % block_size)
            s.length += 1
        starts.append(len(ids))
        lens.append(s.length)
        logit_rows.extend(range(starts[-2], starts[-1]) if all_logits else [starts[-1] - 1])
    width = max(len(s.blocks) for s in seqs)
    tables = np.full((len(seqs), width), -1, np.int32)
    for i, s in enumerate(seqs):
        tables[i, : len(s.blocks)] = s.blocks
    i32 = lambda a: np.asarray(a, np.int32)  # noqa: E731
    return Batch(token_ids=i32(ids), positions=i32(pos), seq_starts=i32(starts), seq_lens=i32(lens),
                 block_tables=tables, slot_mapping=i32(slots), logits_indices=i32(logit_rows),
                 block_size=block_size)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def top_k(logits_row: np.ndarray, k: int = 5) -> list:
    """[(id, logprob)] of the k most likely tokens, most likely first."""
    lp = log_softmax(logits_row)
    part = np.argpartition(-lp, k)[:k]  # O(vocab), then sort only the k winners
    ids = part[np.argsort(-lp[part], kind="stable")]
    return [(int(i), float(lp[i])) for i in ids]


@dataclass
class GreedyResult:
    ids: list
    steps: list  # per generated token: top-5 [(id, logprob)]
    prefill_s: float
    decode_s: float  # wall time of the decode steps (all but the first token)


def greedy(model, prompt_ids, n_new: int, block_size: int = 16, num_blocks: int | None = None,
           kv=None, seed: int = 0) -> GreedyResult:
    """Prefill `prompt_ids`, then decode `n_new` tokens one at a time, greedily."""
    total = len(prompt_ids) + n_new
    num_blocks = num_blocks or -(-total // block_size) + 2
    kv = kv if kv is not None else model.allocate_kv(num_blocks, block_size)
    alloc, seq = ShuffledBlocks(num_blocks, seed), Seq()
    t0 = time.perf_counter()
    logits = model.forward(make_batch([seq], [list(prompt_ids)], alloc, block_size), kv)
    t1 = time.perf_counter()
    ids, steps = [], []
    for i in range(n_new):
        steps.append(top_k(logits[0]))
        ids.append(int(np.argmax(logits[0])))
        if i + 1 < n_new:
            logits = model.forward(make_batch([seq], [[ids[-1]]], alloc, block_size), kv)
    t2 = time.perf_counter()
    return GreedyResult(ids=ids, steps=steps, prefill_s=t1 - t0, decode_s=t2 - t1)


def main(argv=None) -> None:
    """Greedy run of the default model over llama.cpp's reference prompts; prints matches and tok/s.

    python -m tests.models.driver [N_PROMPTS] [N_TOKENS] [BLOCK_SIZE]
    """
    import sys

    from edged.models import load_model
    from edged.quant import load_gguf
    from tests.helpers.model import default_model_path, llamacpp_reference
    from tests.models.test_gemma3_reference import compare

    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    n_prompts, n_tokens, bs = (args + [12, 32, 16][len(args):])[:3]
    model = load_model(load_gguf(default_model_path()))
    greedy(model, [2, 818], 2, block_size=bs)  # compile / warm up
    matched, worst, dec_s, dec_n = 0, 0.0, 0.0, 0
    for i, case in enumerate(llamacpp_reference()["greedy"][:n_prompts]):
        r = greedy(model, case["prompt_ids"], n_tokens, block_size=bs)
        c = compare(r.ids, r.steps, case)
        matched += c.first_diff is None
        worst = max(worst, c.max_logprob_diff)
        dec_s, dec_n = dec_s + r.decode_s, dec_n + n_tokens - 1
        print(f"prompt {i:2d}: {'match' if c.first_diff is None else f'departs at {c.first_diff}'}"
              f" (cross top-5 {c.cross_top5}), max top-1 logprob diff {c.max_logprob_diff:.4f}, "
              f"prefill {len(case['prompt_ids'])} tokens {r.prefill_s * 1e3:.1f} ms", flush=True)
    print(f"{matched}/{n_prompts} match; max top-1 logprob diff {worst:.4f}; "
          f"decode {dec_n / dec_s:.1f} tok/s")


if __name__ == "__main__":
    main()
