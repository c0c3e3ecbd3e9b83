"""Shared checks for the tiny-model tests: edged's forward (paged, batched) against the independent
float64 reference forward of tests/models/reference.py.

Error measure: max |logits - reference| / max |reference| over the compared rows.
Bounds: numpy test backend (float32, dequantized weights) 1e-4 — only float32 rounding separates it
from the float64 reference (measured ~1e-6). CPU backend 0.05 — its quantized kernels quantize
activations to int8 blocks of 32 (~0.5% per dot product, compounded over the layers).
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import tests.helpers.numpy_ops as numpy_ops
from edged.models import load_model
from edged.quant import load_gguf
from tests.models.driver import Seq, ShuffledBlocks, make_batch
from tests.models.reference import ReferenceModel

BACKENDS = ("numpy", "cpu")
TOLERANCE = {"numpy": 1e-4, "cpu": 0.05}


def backend_ops(name: str, gf=None):
    """The ops module for `name`; skips when the CPU backend has no matmul kernel for a weight type."""
    if name == "numpy":
        return numpy_ops
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


def check_prefill(case: TinyCase, backend: str, block_size: int = 16):
    """One prefill of the whole sequence with logits for every row, and with the last row only."""
    model = case.model(backend)
    n = len(case.tokens)
    kv = model.allocate_kv(-(-n // block_size) + 3, block_size)
    logits = model.forward(make_batch([Seq()], [case.tokens], ShuffledBlocks(kv[0].k.shape[0]), block_size,
                                      all_logits=True), kv)
    assert logits.shape == (n, model.vocab_size) and logits.dtype == np.float32
    assert rel_err(logits, case.ref_logits) <= TOLERANCE[backend]
    kv = model.allocate_kv(-(-n // block_size) + 3, block_size)
    last = model.forward(make_batch([Seq()], [case.tokens], ShuffledBlocks(kv[0].k.shape[0], seed=1),
                                    block_size), kv)
    assert last.shape == (1, model.vocab_size)
    assert rel_err(last[0], case.ref_logits[-1]) <= TOLERANCE[backend]


def check_decode(case: TinyCase, backend: str, block_size: int, n_prompt: int = 3):
    """Prefill n_prompt tokens, then feed the rest one token per step (paged, shuffled blocks)."""
    model = case.model(backend)
    n = len(case.tokens)
    num_blocks = -(-n // block_size) + 4
    kv, alloc, seq = model.allocate_kv(num_blocks, block_size), ShuffledBlocks(num_blocks, seed=2), Seq()
    rows = [model.forward(make_batch([seq], [case.tokens[:n_prompt]], alloc, block_size), kv)[0]]
    for t in case.tokens[n_prompt:]:
        rows.append(model.forward(make_batch([seq], [[t]], alloc, block_size), kv)[0])
    assert len(set(seq.blocks)) == len(seq.blocks) == -(-n // block_size)
    assert rel_err(np.stack(rows), case.ref_logits[n_prompt - 1 :]) <= TOLERANCE[backend]


def check_mixed_batch(case: TinyCase, other: TinyCase, backend: str, block_size: int):
    """Two sequences in the same steps: prefill+prefill, decode+prefill chunk mid-sequence, decode+decode."""
    model = case.model(backend)
    a, b = case.tokens, other.tokens  # other: same model file, different tokens
    num_blocks = 2 * (-(-max(len(a), len(b)) // block_size)) + 4
    kv, alloc = model.allocate_kv(num_blocks, block_size), ShuffledBlocks(num_blocks, seed=3)
    sa, sb = Seq(), Seq()
    steps = [(a[:7], b[:3]), (a[7:8], b[3:9]), (a[8:9], b[9:10])]
    for chunk_a, chunk_b in steps:
        start_a, start_b = sa.length, sb.length
        logits = model.forward(make_batch([sa, sb], [chunk_a, chunk_b], alloc, block_size, all_logits=True), kv)
        assert logits.shape == (len(chunk_a) + len(chunk_b), model.vocab_size)
        want = np.concatenate([case.ref_logits[start_a : sa.length], other.ref_logits[start_b : sb.length]])
        assert rel_err(logits, want) <= TOLERANCE[backend]
