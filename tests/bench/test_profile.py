"""The step profiler: attaching changes no output, every phase is counted, detaching restores all."""

import pytest

from edged.engine.engine import Engine, EngineConfig
from edged.bench.profile import StepProfiler
from edged.models import load_model
from edged.quant import load_gguf
from edged.sampling import SamplingParams
from edged.tokenizer import Tokenizer
from tests.helpers.tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("p") / "m.gguf", "gemma3")
    gf = load_gguf(path)
    return load_model(gf), Tokenizer.from_gguf(gf)


@pytest.mark.parametrize("clock", ["wall", "thread"])
def test_profiler_counts_phases_and_detaches(tiny, clock):
    model, tok = tiny
    eng = Engine(model, tok, EngineConfig(num_blocks=64, block_size=4, max_seqs=4)).start()
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    try:
        plain = [[d.token_id for d in eng.add_request(p, params)] for p in prompts]
        layer_ops, out_ops = model.layer_ops, model.output_ops
        prof = StepProfiler(clock).attach(eng)
        streams = [eng.add_request(p, params) for p in prompts]
        profiled = [[d.token_id for d in s] for s in streams]
        prof.detach()
        assert profiled == plain
        assert prof.steps >= 5 and prof.sampled == 10
        ms = prof.per_step_ms()
        for k in ("matmul layers", "matmul output", "attention", "norms/rope/act", "sample", "step total"):
            assert ms[k] > 0, k
        assert ms["step total"] >= ms["matmul layers"] + ms["sample"]
        # every timed op lands in a reported row, not in "forward python" (the decode step's fused
        # layer step once did)
        assert set(prof.calls) <= set(ms) and prof.calls["layer step"] > 0
        assert ms["layer step"] > 0 and ms["forward python"] >= 0
        assert prof.tokens >= 2 + 2 * 4  # a prompt token or more each (prefix cache), 4 decode steps each
        assert model.layer_ops is layer_ops and model.output_ops is out_ops
        assert eng.step_timer is None
    finally:
        eng.stop()
    with pytest.raises(ValueError, match="clock"):
        StepProfiler("cpu")


@pytest.mark.e2e
def test_cli_breakdown_reports_phases_per_level(tmp_path):
    import json

    from click.testing import CliRunner

    from edged.cli import main

    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", context=256)
    res = CliRunner().invoke(main, ["bench", str(path), "--breakdown", "1,2", "--repeat", "1",
                                    "--clock", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["breakdown"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert all(r["step total"] > 0 and r["tokens_per_s"] > 0 for r in rows)
