"""Shared checks for the tiny-model tests: edged's forward (paged, batched) against the independent
float64 reference forward of tests/models/reference.py.

Error measure: max |logits - expected| / max |expected| over the compared rows.
- numpy test backend (float32, dequantized weights) vs the float64 reference: ≤ 1e-4 (only float32
  rounding separates them; measured ~1e-6).
- CPU backend: its kernels round activations through int8 blocks of 32, which moves these random
  tiny models' logits by 1.5-7% (measured; the same with that rounding done in numpy). So it is
  checked twice: vs the float64 reference within 0.1, and vs the numpy backend with the same
  activation rounding (numpy_ops.q8_activation_ops) within 0.05: single matmuls agree to ~1e-7,
  but an activation within float32 noise of a rounding tie can land on the other int8 value, and
  these random models amplify one such flip to up to 2% (measured) in the later rows.
"""

import numpy as np
import pytest

import tests.helpers.numpy_ops as numpy_ops
from edged.models import load_model
from edged.quant import load_gguf
from tests.models.driver import Seq, ShuffledBlocks, make_batch
from tests.models.reference import ReferenceModel

BACKENDS = ("numpy", "cpu")
TOLERANCE = {"numpy": 1e-4, "cpu": 0.1}
CPU_VS_Q8_NUMPY = 0.05


def backend_ops(name: str, gf=None):
    """The ops for `name`; skips when the CPU backend has no matmul kernel for a weight type."""
    if name == "numpy":
        return numpy_ops
    if name == "numpy_q8":
        return numpy_ops.q8_activation_ops
    import edged.backends.cpu as cpu
    from edged.backends.cpu.matmul import supported_types

    if gf is not None:
        missing = {qt.qtype.name for qt in gf.tensors.values() if len(qt.shape) == 2} - {
            t.name for t in supported_types()}
        if missing:
            pytest.skip(f"CPU matmul has no kernel yet for {sorted(missing)}")
    return cpu


class TinyCase:
    """A tiny model file, its reference, and a fixed token sequence to run."""

    def __init__(self, path, n_tokens: int = 13, seed: int = 0):
        self.path = path
        self.gf = load_gguf(path)
        self.ref = ReferenceModel(path)
        vocab = self.gf.tensors["token_embd.weight"].shape[0]
        self.tokens = [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n_tokens)]
        self.ref_logits = self.ref.logits(self.tokens)  # [n_tokens, vocab]

    def model(self, backend: str):
        return load_model(self.gf, backend_ops(backend, self.gf))


def rel_err(ours, ref) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def check(case: TinyCase, backend: str, scenario, *args):
    """Run `scenario(model, case, *args) -> [(logits, expected)]` on `backend` and check the bounds."""
    pairs = scenario(case.model(backend), case, *args)
    for ours, want in pairs:
        assert rel_err(ours, want) <= TOLERANCE[backend]
    if backend == "cpu":
        same_rounding = scenario(case.model("numpy_q8"), case, *args)
        for (ours, _), (theirs, _) in zip(pairs, same_rounding):
            assert rel_err(ours, theirs) <= CPU_VS_Q8_NUMPY


def prefill(model, case: TinyCase, block_size: int = 16):
    """One prefill of the whole sequence with logits for every row, then with the last row only."""
    n = len(case.tokens)
    nb = -(-n // block_size) + 3
    kv = model.allocate_kv(nb, block_size)
    logits = model.forward(make_batch([Seq()], [case.tokens], ShuffledBlocks(nb), block_size, all_logits=True), kv)
    assert logits.shape == (n, model.vocab_size) and logits.dtype == np.float32
    kv = model.allocate_kv(nb, block_size)
    last = model.forward(make_batch([Seq()], [case.tokens], ShuffledBlocks(nb, seed=1), block_size), kv)
    assert last.shape == (1, model.vocab_size)
    return [(logits, case.ref_logits), (last[0], case.ref_logits[-1])]


def decode(model, case: TinyCase, block_size: int, n_prompt: int = 3):
    """Prefill n_prompt tokens, then feed the rest one token per step (paged, shuffled blocks)."""
    n = len(case.tokens)
    num_blocks = -(-n // block_size) + 4
    kv, alloc, seq = model.allocate_kv(num_blocks, block_size), ShuffledBlocks(num_blocks, seed=2), Seq()
    rows = [model.forward(make_batch([seq], [case.tokens[:n_prompt]], alloc, block_size), kv)[0]]
    for t in case.tokens[n_prompt:]:
        rows.append(model.forward(make_batch([seq], [[t]], alloc, block_size), kv)[0])
    assert len(set(seq.blocks)) == len(seq.blocks) == -(-n // block_size)
    return [(np.stack(rows), case.ref_logits[n_prompt - 1 :])]


def mixed_batch(model, case: TinyCase, other: TinyCase, block_size: int):
    """Two sequences per step: prefill+prefill, decode+prefill chunk mid-sequence, decode+decode."""
    a, b = case.tokens, other.tokens  # other: same model file, different tokens
    num_blocks = 2 * (-(-max(len(a), len(b)) // block_size)) + 4
    kv, alloc = model.allocate_kv(num_blocks, block_size), ShuffledBlocks(num_blocks, seed=3)
    sa, sb = Seq(), Seq()
    pairs = []
    for chunk_a, chunk_b in [(a[:7], b[:3]), (a[7:8], b[3:9]), (a[8:9], b[9:10])]:
        start_a, start_b = sa.length, sb.length
        logits = model.forward(make_batch([sa, sb], [chunk_a, chunk_b], alloc, block_size, all_logits=True), kv)
        assert logits.shape == (len(chunk_a) + len(chunk_b), model.vocab_size)
        want = np.concatenate([case.ref_logits[start_a : sa.length], other.ref_logits[start_b : sb.length]])
        pairs.append((logits, want))
    return pairs
