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
        assert model.layer_ops is layer_ops and model.output_ops is out_ops
        assert "_step" not in vars(eng) and "forward" not in vars(model)
        assert "schedule" not in vars(eng.scheduler) and "sample" not in vars(eng.sampler)
        import edged.engine.engine as engine_mod
        from edged.engine.runner import build_batch
        assert engine_mod.build_batch is build_batch
    finally:
        eng.stop()
    with pytest.raises(ValueError, match="clock"):
        StepProfiler("cpu")
