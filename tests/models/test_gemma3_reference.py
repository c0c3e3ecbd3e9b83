"""The default model (Gemma 3 270M Q4_K_M) on the CPU backend against llama.cpp's recorded greedy
continuations (tests/fixtures/gemma3_270m_q4km_llamacpp.json; prompt ids given, no tokenizer).

Acceptance (issue 4), checked in full by the slow test: at least 11 of the 12 continuations equal
llama.cpp's 32 ids; where one departs, at the first difference each engine's token is in the other's
top-5; at matched positions the top-1 logprob differs by at most 0.1.

That criterion is met only by llama.cpp's exact float operation order (bench/llamacpp_probe.py): the
same llama-server build scores 4/12 (worst 0.15) with weight repacking off (-nr: same integers, other
float summation order in the Q4_K dots), 6/12 (0.26) with -fa off, 4/12 (0.30) with -fa off and an
f32 KV cache; a numpy emulation of every documented llama.cpp rounding (tests/models/
llamacpp_emulation.py; intermediate sums equal llama.cpp's to ~1e-6 for the first layers) scores 5/12
(0.26), a float64 forward 5/12 (0.38). Per-256 Q8_K activation grids and float16 attention sums turn
1e-7 differences into whole quantization steps, and this model's logits (output_norm weights up to
301) turn those into ~0.1-0.3 logprob.
"""

from dataclasses import dataclass

import numpy as np
import pytest

from edged.models import load_model
from edged.quant import load_gguf
from tests.helpers.model import default_model_path, llamacpp_reference
from tests.models.driver import Seq, ShuffledBlocks, greedy, log_softmax, make_batch

LOGPROB_BOUND = 0.1  # acceptance: |top-1 logprob (ours) - top-1 logprob (llama.cpp)| at matched positions

# Teacher-forced bounds (fast test). This model's logits are large (output_norm weights up to 301),
# so rounding noise alone — int8 activations here; Q8_K activations, an f16 KV cache and an f16
# GELU table in llama.cpp — moves single top-1 logprobs by up to ~0.4: an exact float forward
# differs from llama.cpp by up to 0.38 and agrees on 373/384 top-1s. Measured on the CPU backend:
# 369/384 agree, every top-1 in the other's top-5, mean |diff| 0.035, 90th percentile 0.10. A wrong
# graph shows up in the aggregate: local/global RoPE bases swapped gives 334/384, mean 0.36.
TF_MIN_AGREE = 0.95  # fraction of steps where the two top-1 tokens are equal
TF_MIN_CROSS_TOP5 = 0.99  # fraction of steps where each top-1 is in the other's top-5
TF_MAX_MEAN_DIFF = 0.06
TF_MAX_P90_DIFF = 0.15
FAST_MAX_LOGPROB_DIFF = 0.5  # greedy smoke test: any single step


@pytest.fixture(scope="module")
def model():
    return load_model(load_gguf(default_model_path()))


@pytest.fixture(scope="module")
def cases():
    return llamacpp_reference()["greedy"]


@dataclass
class Comparison:
    first_diff: int | None  # index of the first generated token that differs, None if all equal
    max_logprob_diff: float  # |top-1 logprob diff| over the matched positions (before first_diff)
    cross_top5: bool  # at the first difference: each token in the other's top-5


def compare(ids: list, steps: list, case: dict) -> Comparison:
    """Our greedy ids and per-step top-5 [(id, logprob)] against one llama.cpp greedy record.

    Matched positions are those before the first difference (where both engines emitted the same
    token from the same context); after a departure the contexts differ and nothing is compared."""
    want = case["ids"][: len(ids)]
    first = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), None)
    matched = len(ids) if first is None else first
    lp = max((abs(steps[i][0][1] - case["steps"][i]["top"][0][1]) for i in range(matched)), default=0.0)
    cross = True
    if first is not None:
        theirs = [t for t, _ in case["steps"][first]["top"]]
        ours = [t for t, _ in steps[first]]
        cross = ids[first] in theirs and want[first] in ours
    return Comparison(first, lp, cross)


def test_teacher_forced_steps_in_one_batch(model, cases):
    """All 12 prompts followed by llama.cpp's own 32 continuation tokens, as one mixed prefill batch
    with logits for every row: at each of the 384 steps the context equals llama.cpp's, so its
    recorded top-5 applies."""
    bs = 16
    seqs = [c["prompt_ids"] + c["ids"][:-1] for c in cases]
    n_blocks = sum(-(-len(s) // bs) for s in seqs)
    kv = model.allocate_kv(n_blocks, bs)
    batch = make_batch([Seq() for _ in seqs], seqs, ShuffledBlocks(n_blocks), bs, all_logits=True)
    logits = model.forward(batch, kv)  # [sum of lengths, vocab]
    agree, cross, diffs = 0, 0, []
    for s, case in enumerate(cases):
        first_row = int(batch.seq_starts[s]) + len(case["prompt_ids"]) - 1
        for i, step in enumerate(case["steps"]):
            lp = log_softmax(logits[first_row + i])
            ours = list(np.argsort(-lp)[:5])
            theirs = [t for t, _ in step["top"]]
            agree += ours[0] == theirs[0]
            cross += ours[0] in theirs and theirs[0] in ours
            diffs.append(abs(lp[theirs[0]] - step["top"][0][1]))
    n, diffs = len(diffs), np.array(diffs)
    summary = f"agree {agree}/{n}, cross top-5 {cross}/{n}, mean {diffs.mean():.4f}, p90 {np.quantile(diffs, 0.9):.4f}"
    assert agree >= TF_MIN_AGREE * n and cross >= TF_MIN_CROSS_TOP5 * n, summary
    assert diffs.mean() <= TF_MAX_MEAN_DIFF and np.quantile(diffs, 0.9) <= TF_MAX_P90_DIFF, summary


@pytest.mark.parametrize("index", [0, 4])
def test_greedy_8_tokens(model, cases, index):
    """Short greedy continuations equal llama.cpp's (block size 16, shuffled blocks)."""
    r = greedy(model, cases[index]["prompt_ids"], 8)
    c = compare(r.ids, r.steps, cases[index])
    assert c.first_diff is None, f"departs at {c.first_diff}: {r.ids} vs {cases[index]['ids'][:8]}"
    assert c.max_logprob_diff <= FAST_MAX_LOGPROB_DIFF


@pytest.mark.slow
def test_greedy_12_prompts_32_tokens(model, cases):
    """The acceptance check: 12 prompts x 32 greedy tokens (block size 4 to cross many blocks)."""
    results = []
    for case in cases:
        r = greedy(model, case["prompt_ids"], len(case["ids"]), block_size=4)
        results.append(compare(r.ids, r.steps, case))
    matched = [i for i, c in enumerate(results) if c.first_diff is None]
    report = {i: (c.first_diff, round(c.max_logprob_diff, 4)) for i, c in enumerate(results)}
    assert len(matched) >= len(cases) - 1, report
    assert all(c.cross_top5 for c in results), report
    assert max(c.max_logprob_diff for c in results) <= LOGPROB_BOUND, report
