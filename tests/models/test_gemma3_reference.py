"""The default model (Gemma 3 270M Q4_K_M) on the CPU backend against llama.cpp's recorded outputs
(tests/fixtures/gemma3_270m_q4km_llamacpp.json; prompt ids given, no tokenizer).

The fidelity criteria (issue 13, accepted by the planners): teacher-forced over the 12 reference
prompts x 32 steps, top-1 agreement >= 367/384, |top-1 logprob (ours) - (llama.cpp's)| mean <= 0.04,
p90 <= 0.12, max <= 0.35; where free-running greedy parts from llama.cpp, each engine's token is in
the other's top-5; perplexity within 0.5% of llama.cpp's. Bit-equal greedy tokens are not asked for:
they hinge on llama.cpp's own float summation order (docs/investigations/llamacpp_numerics.md).
"""

from dataclasses import dataclass

import numpy as np
import pytest

from edged.backends.base import KV_DEFAULT
from edged.models import load_model
from edged.perplexity import perplexity
from edged.quant import load_gguf
from edged.tokenizer import Tokenizer
from tests.helpers.model import FIXTURES, default_model_path, llamacpp_reference
from tests.models.driver import Seq, ShuffledBlocks, greedy, log_softmax, make_batch

TF_MIN_AGREE = 367  # of 384 teacher-forced steps: the two top-1 tokens are equal
TF_MAX_MEAN_DIFF = 0.04  # |top-1 logprob diff| over the 384 steps: mean, 90th percentile, max
TF_MAX_P90_DIFF = 0.12
TF_MAX_DIFF = 0.35
LLAMACPP_PPL = 13.9062  # llama-perplexity, GPL-3 text, ctx 512 (shared/refdata)
PPL_REL_TOL = 0.005


@pytest.fixture(scope="module")
def model():
    m = load_model(load_gguf(default_model_path()))
    m.kv_type = KV_DEFAULT  # the KV cache edged serves (f16), as llama.cpp's recorded runs had
    return m


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


def test_teacher_forced_fidelity(model, cases):
    """All 12 prompts followed by llama.cpp's own 32 continuation tokens, as one mixed prefill batch
    with logits for every row: at each of the 384 steps the context equals llama.cpp's, so its
    recorded top-5 applies."""
    bs = 16
    seqs = [c["prompt_ids"] + c["ids"][:-1] for c in cases]
    n_blocks = sum(-(-len(s) // bs) for s in seqs)
    kv = model.allocate_kv(n_blocks, bs)
    batch = make_batch([Seq() for _ in seqs], seqs, ShuffledBlocks(n_blocks), bs, all_logits=True)
    logits = model.forward(batch, kv)  # [sum of lengths, vocab]
    agree, diffs = 0, []
    for s, case in enumerate(cases):
        first_row = int(batch.seq_starts[s]) + len(case["prompt_ids"]) - 1
        for i, step in enumerate(case["steps"]):
            lp = log_softmax(logits[first_row + i])
            theirs = step["top"][0][0]
            agree += int(np.argmax(lp)) == theirs
            diffs.append(abs(lp[theirs] - step["top"][0][1]))
    n, diffs = len(diffs), np.array(diffs)
    assert n == 384
    summary = (f"agree {agree}/{n}, mean {diffs.mean():.4f}, p90 {np.quantile(diffs, 0.9):.4f}, "
               f"max {diffs.max():.4f}")
    print(summary)
    assert agree >= TF_MIN_AGREE, summary
    assert diffs.mean() <= TF_MAX_MEAN_DIFF, summary
    assert np.quantile(diffs, 0.9) <= TF_MAX_P90_DIFF, summary
    assert diffs.max() <= TF_MAX_DIFF, summary


@pytest.mark.parametrize("index", [0, 4])
def test_greedy_8_tokens(model, cases, index):
    """Short greedy continuations equal llama.cpp's (block size 16, shuffled blocks)."""
    r = greedy(model, cases[index]["prompt_ids"], 8)
    c = compare(r.ids, r.steps, cases[index])
    assert c.first_diff is None, f"departs at {c.first_diff}: {r.ids} vs {cases[index]['ids'][:8]}"
    assert c.max_logprob_diff <= TF_MAX_DIFF


@pytest.mark.slow
def test_free_running_greedy_parts_within_top5(model, cases):
    """12 prompts x 32 greedy tokens (block size 4 to cross many blocks): where our greedy tokens part
    from llama.cpp's, each engine's token is in the other's top-5; before that, the top-1 logprobs
    stay within the teacher-forced max."""
    results = [compare(*_greedy_record(model, case), case) for case in cases]
    report = {i: (c.first_diff, c.cross_top5, round(c.max_logprob_diff, 4)) for i, c in enumerate(results)}
    print(report)
    assert all(c.cross_top5 for c in results), report
    assert max(c.max_logprob_diff for c in results) <= TF_MAX_DIFF, report


def _greedy_record(model, case) -> tuple[list, list]:
    r = greedy(model, case["prompt_ids"], len(case["ids"]), block_size=4)
    return r.ids, r.steps


@pytest.mark.slow
def test_perplexity_within_half_percent_of_llamacpp(model):
    """llama.cpp's method at ctx 512 on the GPL-3 text gives a PPL within 0.5% of llama-perplexity's."""
    gguf = load_gguf(default_model_path())
    tok = Tokenizer.from_gguf(gguf)
    text = (FIXTURES / "ppl_text_gpl3.txt").read_text(encoding="utf-8", errors="replace")
    ids = tok.encode(text, add_special=True, parse_special=False)
    *_, last = perplexity(model, ids, tok.bos_id, ctx=512)
    assert abs(last.ppl / LLAMACPP_PPL - 1) <= PPL_REL_TOL, last.ppl
