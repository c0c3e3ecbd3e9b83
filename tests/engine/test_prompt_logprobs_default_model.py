"""Prompt logprobs on the default model against llama.cpp (issue 16 item 4's acceptance): each of
llama.cpp's 12 reference greedy continuations teacher-forced through one prompt-logprobs request
(what echo + logprobs + max_tokens 0 asks of the engine); the logprob edged gives each of llama.cpp's
384 tokens is within the fidelity band of llama.cpp's own (mean |d| <= 0.04, max <= 0.35)."""

import numpy as np
import pytest

from edged.backends.base import KV_DEFAULT
from edged.engine.engine import Engine, EngineConfig
from edged.models import load_model
from edged.quant import load_gguf
from edged.sampling import SamplingParams
from edged.tokenizer import Tokenizer
from tests.helpers.model import default_model_path, llamacpp_reference

MAX_MEAN_DIFF = 0.04
MAX_DIFF = 0.35


@pytest.fixture(scope="module")
def gemma():
    gf = load_gguf(default_model_path())
    model = load_model(gf)
    model.kv_type = KV_DEFAULT  # the KV cache edged serves (f16), as llama.cpp's recorded runs had
    return model, Tokenizer.from_gguf(gf)


def test_echo_logprobs_of_llamacpp_continuations(gemma):
    model, tok = gemma
    cases = llamacpp_reference()["greedy"]
    # 96-row scoring steps: the 12 requests take several steps each, side by side
    eng = Engine(model, tok, EngineConfig(num_blocks=128, block_size=16, max_batch_tokens=256,
                                          max_seqs=16, max_scored_rows=96)).start()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=1)
        streams = [eng.add_request(c["prompt_ids"] + c["ids"], params) for c in cases]
        diffs = []
        for case, s in zip(cases, streams):
            (d,) = list(s)
            assert d.finish_reason == "length" and d.token_id is None
            entries = d.prompt_logprobs
            n = len(case["prompt_ids"])
            assert entries[0] is None and len(entries) == n + len(case["ids"])
            for i, step in enumerate(case["steps"]):
                assert step["top"][0][0] == case["ids"][i]  # llama.cpp's greedy token is its top-1
                diffs.append(abs(entries[n + i].logprob - step["top"][0][1]))
        diffs = np.array(diffs)
        summary = f"{len(diffs)} tokens: mean |d| {diffs.mean():.4f}, max {diffs.max():.4f}"
        print(summary)
        assert len(diffs) == 384
        assert diffs.mean() <= MAX_MEAN_DIFF and diffs.max() <= MAX_DIFF, summary
        st = eng.stats()
        assert st.running == 0 and st.blocks_used == 0
    finally:
        eng.stop()
