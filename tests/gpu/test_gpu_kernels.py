"""Every CUDA op at realistic sizes on a real device, against the CPU backend (tests/backends/cuda
runs the same checks at tiny sizes under the simulator). Matmuls are checked against
checks.matmul_reference (the CPU's numerics in numpy) rather than the CPU kernels, whose cold
compile would take minutes of the device budget; test_gpu_model compares the model's real
tensors with the CPU kernels themselves."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.backends.cuda.checks import (
    ALL_TYPES, check_act_quant, check_attention, check_elementwise, check_embed, check_matmul, check_rms_norm, check_rope, ops,
)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul(qtype):
    check_matmul(qtype, m=512, k=2048, ns=(1, 5, 16, 64), against_cpu=False)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_matmul_odd_shapes(qtype):
    k = 640 if qtype == T.Q8_0 else 768  # 20 / 24 blocks: partial mat-vec step, partial tile stage
    check_matmul(qtype, m=333, k=k, ns=(7, 9, 100), seed=1, against_cpu=False)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_embed(qtype):
    check_embed(qtype, m=64, k=2048, ids=[63, 0, 5, 5, 17])


def test_act_quant_bit_identical():
    check_act_quant(n=64, k=2048)


def test_norm_rope_elementwise():
    check_rms_norm(n=64, d=2048)
    check_rms_norm(n=256, d=256)
    check_rope(n=64, heads=8, hd=128, dim=128, neox=True, factors=False)
    check_rope(n=64, heads=4, hd=256, dim=128, neox=False, factors=True)
    check_elementwise(n=64, f=4096)


GEMMA = dict(bs=16, kvh=1, g=4, hd=256)
LLAMA = dict(bs=16, kvh=2, g=4, hd=128)
SEQS = [(500, 12), (0, 64), (1000, 1), (300, 1)]


@pytest.mark.parametrize("shape", [GEMMA, LLAMA], ids=["gemma", "llama"])
def test_attention(shape):
    check_attention(**shape, seqs=SEQS)
    check_attention(**shape, seqs=SEQS, window=512, softcap=50.0, seed=1)


def test_ops_never_return_host_arrays():
    o = ops()
    d = o.upload(np.ones((2, 8), np.float32))
    for out in (o.add(d, d), o.scale(d, 2.0), o.silu_mul(d, d), o.take_rows(d, np.array([1], np.int32))):
        assert not isinstance(out, np.ndarray)
    free, total = o.device_memory()
    assert 0 < free <= total
