"""The engine's non-finite guard (issue 18): a sampled row whose logits hold NaN or inf fails that
request with a clear error and frees its KV; the other requests of the batch continue unchanged;
Engine.stats().nonfinite_rows counts the rows."""

import numpy as np
import pytest

from edged.engine.nonfinite import nonfinite_rows
from edged.sampling import SamplingParams
from tests.engine.engine_helpers import assert_all_blocks_free, greedy, load_tiny, start_engine, token_ids

POISONED_PROMPT = list(range(5, 35))  # 30 tokens: its first sampled row is at position 29
HEALTHY_PROMPTS = [list(range(40, 45)), list(range(50, 58))]  # with 6 tokens out: positions < 20


class PoisonedModel:
    """The tiny model, except that logits rows sampled at `position` get `value` in one entry."""

    def __init__(self, model, position: int, value: float):
        self._model, self.position, self.value = model, position, value

    def __getattr__(self, name):
        return getattr(self._model, name)

    def forward(self, batch, kv):
        logits = self._model.forward(batch, kv)
        rows = batch.positions[batch.logits_indices] == self.position
        logits[rows, 7] = self.value
        return logits


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny(tmp_path_factory.mktemp("m"), "llama")


def test_nonfinite_rows():
    x = np.zeros((4, 10), dtype=np.float32)
    assert nonfinite_rows(x) == []
    x[1, 3], x[3, 9] = np.nan, -np.inf
    assert nonfinite_rows(x) == [1, 3]
    x[0, 0] = np.inf
    assert nonfinite_rows(x) == [0, 1, 3]
    x[:] = np.finfo(np.float32).max  # huge but finite
    assert nonfinite_rows(x) == []


def _sampled():
    return SamplingParams(temperature=0.9, top_p=0.95, seed=3, max_tokens=6, ignore_eos=True)


@pytest.mark.parametrize("value,position,params", [
    (np.nan, 29, greedy), (np.inf, 29, greedy), (-np.inf, 29, greedy), (np.nan, 32, greedy),
    (np.nan, 31, _sampled)])
def test_poisoned_row_fails_its_request_only(tiny, value, position, params):
    model, tok = tiny
    clean = start_engine(tiny)
    eng = start_engine((PoisonedModel(model, position, value), tok))
    try:
        ref = [token_ids(clean.generate(p, params())) for p in HEALTHY_PROMPTS]
        bad = eng.add_request(POISONED_PROMPT, params())  # all in the same steps
        healthy = [eng.add_request(p, params()) for p in HEALTHY_PROMPTS]
        deltas = list(bad)
        assert [token_ids(list(s), "length") for s in healthy] == ref
        last = deltas[-1]
        assert last.finish_reason == "error"
        assert last.error == (f"logits are not finite (NaN or inf) at position {position}; "
                              "the model file or its metadata is broken")
        assert len(token_ids(deltas)) == position - 29  # the tokens sampled before the poisoned row
        assert eng.stats().nonfinite_rows == 1 and clean.stats().nonfinite_rows == 0
        assert_all_blocks_free(eng)
    finally:
        clean.stop()
        eng.stop()
