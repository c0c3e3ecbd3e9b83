"""What the engine tests share: a tiny model with its tokenizer, an engine over it, greedy
requests, their token ids, random prompts and the check that every block went back."""

import numpy as np

from edged.engine.engine import Engine, EngineConfig
from edged.models import load_model
from edged.quant import load_gguf
from edged.sampling import SamplingParams
from edged.tokenizer import Tokenizer
from tests.helpers.tiny_models import write_tiny_model


def load_tiny(path_dir, arch: str, **options):
    """(model, tokenizer) of a tiny random `arch` model written under path_dir."""
    gf = load_gguf(write_tiny_model(path_dir / "m.gguf", arch, **options))
    return load_model(gf), Tokenizer.from_gguf(gf)


def start_engine(model_and_tok, **cfg) -> Engine:
    """A started engine: 256 blocks of 4, 64-token steps, 16 sequences unless cfg says otherwise."""
    model, tok = model_and_tok
    config = EngineConfig(**{"num_blocks": 256, "block_size": 4, "max_batch_tokens": 64,
                             "max_seqs": 16, **cfg})
    return Engine(model, tok, config).start()


def greedy(n: int = 6, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def token_ids(deltas, finish: str | None = None) -> list[int]:
    """The generated ids of a finished request (its last delta finished it, with `finish` if given)."""
    assert deltas[-1].finish_reason is not None if finish is None else deltas[-1].finish_reason == finish, \
        deltas[-1]
    return [d.token_id for d in deltas if d.token_id is not None]


def random_prompts(vocab: int, n: int = 16, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(4, vocab, size=int(rng.integers(1, 40))).tolist() for _ in range(n)]


def assert_all_blocks_free(engine) -> None:
    """No request left and every block of both pools free (cached ones included)."""
    st = engine.stats()
    assert st.running == 0 and st.waiting == 0
    assert st.blocks_free == st.blocks_total and st.window_blocks_free == st.window_blocks_total


def assert_preempted_equal(big, small, prompts, submit, ids=token_ids) -> None:
    """Each prompt through `small` (short of blocks, so it preempts) gives the tokens it gets through
    `big`; submit(engine, prompt) -> stream, all of small's submitted at once."""
    ref = [ids(list(submit(big, p))) for p in prompts]
    streams = [submit(small, p) for p in prompts]
    assert [ids(list(s)) for s in streams] == ref
    assert small.stats().preemptions > 0
    assert_all_blocks_free(small)


def assert_prefix_hit_repeats(engine, prompt, params, hit_tokens: int, ids=token_ids) -> None:
    """The same prompt twice: the second run reuses `hit_tokens` cached tokens and gives the same ids."""
    a = ids(engine.generate(prompt, params))
    hits0 = engine.kv.prefix_hits
    b = ids(engine.generate(prompt, params))
    assert engine.kv.prefix_hits - hits0 == hit_tokens
    assert a == b
    assert_all_blocks_free(engine)
