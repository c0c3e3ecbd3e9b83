"""Float-weight kernels (F32, F16, BF16) against gguf-py's dequantize + numpy in float64, and the
canonical per-(row, token) order of backends/cpu/matmul_float that makes every batch size give the
same bits."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import llvmlite.binding as llvm
import numba as nb
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import matmul_float, matmul_reference
from edged.backends.cpu.matmul_float import F16, tile_dot
from tests.backends.matmul_cases import activations, check_close_to_dequantized
from tests.helpers.qdata import random_qtensor, reference_dequantize

mm = sys.modules["edged.backends.cpu.matmul"]

# ||y - y_ref|| / ||y_ref|| against a float64 product: the weights widen exactly, so only float32
# accumulation rounding remains (measured <= 1e-7 up to k = 2048); 1e-6 for every float type.
REL_BOUND = {T.F32: 1e-6, T.F16: 1e-6, T.BF16: 1e-6}
TYPES = list(REL_BOUND)
KS = [1, 17, 96, 100, 640, 2048]  # 1, 17, 100: a partial 16-lane slice at the end of each row
MS = [7, 33]  # partial 8-row and 4-row tiles
NS = [1, 2, 3, 4, 5, 17, 64]  # every gemv tile shape; gemm with 0, 5 and 4 leftover tokens



@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_matches_reference(qtype, k):
    check_close_to_dequantized(mm.matmul, qtype, k, MS, NS, REL_BOUND[qtype])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_token_rows_identical_for_every_batch_size(qtype):
    """Batch invariance: each token's row is bit-identical alone (gemv, 8x1 tiles) and inside any
    batch (8x2, 4x4, 4x6 tiles, leftover-token tiles), at any position, on both entry points."""
    m, k = 13, 100  # partial row tiles, partial last slice
    w = random_qtensor(qtype, m, k, seed=5)
    gemv, gemm = mm.kernels_for(qtype)
    x = activations(19, k, 6)
    alone = np.stack([mm.matmul(w, x[t : t + 1])[0] for t in range(x.shape[0])])  # [19, m]
    for n in list(range(1, 14)) + [16, 19]:
        for kern in (gemv, gemm):
            y = np.full((n, m), np.nan, np.float32)
            kern(w.rows(), x[:n], y)
            np.testing.assert_array_equal(y, alone[:n], err_msg=f"n={n} {kern.__name__}")
    # a token at another position of another batch: its row does not move
    y = mm.matmul(w, np.ascontiguousarray(x[::-1]))
    np.testing.assert_array_equal(y[::-1], alone)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_token_blocks_and_prefetched_strips_identical(qtype):
    """gemm's outer structure: 16-row tasks (strips prefetching the next), k large enough for
    6-token blocks (13 tokens: blocks 6, 6, 1) — still each token's row as computed alone."""
    m, k = 72, 12288
    assert matmul_float.X_BLOCK_BYTES // (4 * k) < 6  # one 6-token tile per block
    w = random_qtensor(qtype, m, k, seed=9)
    x = activations(13, k, 10)
    y = mm.matmul(w, x)
    for t in range(x.shape[0]):
        np.testing.assert_array_equal(y[t], mm.matmul(w, x[t : t + 1])[0], err_msg=f"token {t}")
    ref = x.astype(np.float64) @ reference_dequantize(w).astype(np.float64).T
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= REL_BOUND[qtype]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_canonical_order_exact(qtype):
    """The kernels' bits are those of the documented order (not just close to the product): the
    plain reference of it, with an exactly rounded fma (more shapes: test_matmul_reference.py)."""
    m, k = 9, 100
    w = random_qtensor(qtype, m, k, seed=7)
    for n in (1, 7):
        x = activations(n, k, 8)
        np.testing.assert_array_equal(mm.matmul(w, x), matmul_reference.matmul_float_reference(w, x))


def _tile_all(w, x, y):
    for r0 in range(0, w.shape[0], 4):
        for t0 in range(0, x.shape[0], 4):
            tile_dot(F16, 4, 4, w, x, y, r0, t0, -1)


@pytest.mark.parametrize("use_f16c", [False, True] if matmul_float.USE_F16C else [False])
def test_every_f16_pattern_widens_exactly(use_f16c):
    """All 65536 half patterns (subnormals, inf, NaN) on the chosen codegen path: token t is the
    one-hot e_t, so y[t, r] is weight (r, t) widened (NaN where an inf meets a 0, as in numpy)."""
    w = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(4096, 16)  # [4096, 16] patterns
    x = np.eye(16, dtype=np.float32)  # [16 tokens, 16]
    saved = matmul_float.USE_F16C
    try:
        matmul_float.USE_F16C = use_f16c
        run = nb.njit(cache=False)(_tile_all)
        y = np.zeros((16, 4096), np.float32)
        with np.errstate(invalid="ignore"):
            run(w.view(np.uint8), x, y)
            ref = x.astype(np.float64) @ w.view(np.float16).astype(np.float64).T
    finally:
        matmul_float.USE_F16C = saved
    np.testing.assert_array_equal(y, ref.astype(np.float32))
    assert ("vcvtph2ps" in run.inspect_asm(run.signatures[0])) == use_f16c


@pytest.mark.skipif(not llvm.get_host_cpu_features().get("avx512f", False), reason="host has no AVX-512")
def test_tile_is_avx512_fma():
    """The tile's inner loop is 512-bit FMAs (no scalar or 256-bit fallback)."""
    run = nb.njit(cache=False)(_tile_all)
    run(np.zeros((4, 64), np.uint8), np.zeros((4, 32), np.float32), np.zeros((4, 4), np.float32))
    asm = run.inspect_asm(run.signatures[0])
    assert "vfmadd231ps\t%zmm" in asm or "vfmadd213ps\t%zmm" in asm


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_special_values_propagate(qtype):
    """inf/NaN weights widen exactly, so they reach the output as numpy's do, at any n."""
    w = random_qtensor(qtype, 3, 32, seed=0)
    f = {T.F32: np.float32, T.F16: np.float16, T.BF16: np.uint16}[qtype]
    v = w.data.view(f)
    if qtype == T.BF16:
        v[0], v[32] = 0x7F80, 0x7FC0  # bfloat16 +inf, NaN
    else:
        v[0], v[32] = np.inf, np.nan
    for n in (1, 9):
        y = mm.matmul(w, np.ones((n, 32), np.float32))
        assert np.isposinf(y[:, 0]).all() and np.isnan(y[:, 1]).all() and np.isfinite(y[:, 2]).all()
