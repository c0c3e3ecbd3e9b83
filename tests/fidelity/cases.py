"""Tiny random-weight models on which edged is compared with llama.cpp (issue 19's fidelity line).

Each case is written deterministically by tests/helpers/tiny_models.py; tests/fixtures/llamacpp_tiny.json
holds llama.cpp's greedy run on it (record_llamacpp.py), keyed by the case name and the file's sha256.
"""

from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as T

STEPS = 32  # greedy steps recorded per case
GAIN = 8.0  # logit_gain: next-token distributions about as peaked as a real model's


@dataclass(frozen=True)
class Case:
    name: str
    arch: str
    overrides: dict = field(default_factory=dict)
    seed: int = 1
    prompt_len: int = 8


def _wide(arch: str, qtype, **kw) -> dict:
    # 256-element-block types need every matrix's columns to be a multiple of 256
    return dict(n_embd=256, n_ff=256, head_dim=64, matrix_type=qtype, logit_gain=GAIN, **kw)


CASES = [
    Case("llama-mixed", "llama", dict(logit_gain=GAIN)),
    Case("qwen2-mixed", "qwen2", dict(logit_gain=GAIN)),
    Case("qwen3-mixed", "qwen3", dict(logit_gain=GAIN)),
    Case("gemma3-mixed", "gemma3", dict(logit_gain=GAIN)),
    Case("gemma2-mixed", "gemma2", dict(logit_gain=GAIN, final_softcap=10.0)),  # the cap bends, not flattens
    Case("qwen3moe-mixed", "qwen3moe", dict(logit_gain=GAIN)),
    Case("gpt-oss-mxfp4", "gpt-oss", dict(logit_gain=GAIN)),
    Case("llama-q4_k", "llama", _wide("llama", T.Q4_K)),
    Case("llama-iq4_xs", "llama", _wide("llama", T.IQ4_XS)),
    *(Case(f"llama-{t.name.lower()}", "llama", _wide("llama", t), seed=2)
      for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.MXFP4)),
]


def by_name() -> dict:
    return {c.name: c for c in CASES}


def prompt_ids(case: Case, vocab: int) -> list[int]:
    """A fixed prompt of ordinary (non-special) token ids: 3 .. vocab-1."""
    import numpy as np

    rng = np.random.default_rng(1000 + case.seed)
    return [int(t) for t in rng.integers(3, vocab, case.prompt_len)]
