"""Legacy 32-element block kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) against gguf-py's
dequantize + numpy, through the dispatcher and through both kernels (gemv and gemm) directly."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numba as nb
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import legacy_gemm_tile, legacy_gemv, matmul_legacy, matmul_reference, vector_ir
from edged.backends.cpu.act_quant import quantize_activations
from edged.backends.cpu.legacy_blocks import GROUPED_KINDS
from tests.backends.matmul_cases import activations, check_close_to_dequantized, rel_err
from tests.helpers.qdata import random_qtensor, reference_dequantize

mm = sys.modules["edged.backends.cpu.matmul"]

# ||y - y_ref|| / ||y_ref|| bounds. The error is the int8 activation rounding (per-32 scales):
# median 0.53 % over this test matrix for every type; worst case (k=32, m=7, n=1: seven outputs of
# one block) measured Q8_0 0.74 %, Q5_0 0.89 %, Q4_0 1.51 %, Q4_1 1.55 %, IQ4_NL 1.63 %, Q5_1 2.01 %.
REL_BOUND = {T.Q8_0: 1.2e-2, T.Q5_0: 1.2e-2, T.Q4_0: 2.2e-2, T.Q4_1: 2.2e-2, T.IQ4_NL: 2.2e-2, T.Q5_1: 2.8e-2}
TYPES = list(REL_BOUND)
KS = [32, 64, 96, 640, 2048]
MS = [7, 33]
NS = [1, 3, 17, 64]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_matches_reference(qtype, k):
    check_close_to_dequantized(mm.matmul, qtype, k, MS, NS, REL_BOUND[qtype])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemv_and_gemm_bit_identical(qtype):
    """Both kernels on the same quantized activations give bit-identical outputs (the canonical
    8-lane float order), for k with no, one and several 8-block groups plus a partial group, and
    n values each path rarely sees (n=3 through gemm: a partial 16-token tile; n=17 through gemv)."""
    gemv, gemm = mm.kernels_for(qtype)
    for k in (96, 288, 640):
        m = 33
        w = random_qtensor(qtype, m, k, seed=k)
        for n in (1, 3, 17):
            qx = quantize_activations(activations(n, k, seed=9))
            y1 = np.full((n, m), np.nan, np.float32)
            y2 = np.full((n, m), np.nan, np.float32)
            gemv(w.rows(), *qx, y1)
            gemm(w.rows(), *qx, y2)
            np.testing.assert_array_equal(y1, y2, err_msg=f"{qtype.name} k={k} n={n}")


def test_matmul_uses_gemv_up_to_its_threshold():
    """matmul runs the legacy types' gemv up to matmul_legacy.GEMV_MAX_N tokens (it beats the tile
    gemm there) and the tile gemm above; both sides match the tile gemm bit for bit."""
    w = random_qtensor(T.Q5_0, 9, 64, seed=2)
    assert mm.gemv_max_n(T.Q5_0) == matmul_legacy.GEMV_MAX_N
    for n in (matmul_legacy.GEMV_MAX_N, matmul_legacy.GEMV_MAX_N + 1):
        qx = quantize_activations(activations(n, 64, seed=n))
        ref = np.empty((n, 9), np.float32)
        mm.kernels_for(T.Q5_0)[1](w.rows(), *qx, ref)
        np.testing.assert_array_equal(mm.matmul(w, activations(n, 64, seed=n), qx=qx), ref)


def _canonical_q8_0(w, xq, xd, xs):
    """The canonical 8-lane float order, in float32 numpy (matmul_reference's legacy epilogue)."""
    return matmul_reference.matmul_reference(w, None, qx=(xq, xd, xs))


def test_canonical_order_exact():
    """gemv and gemm reproduce the documented float order bit for bit (numpy float32 model)."""
    gemv, gemm = mm.kernels_for(T.Q8_0)
    for k in (64, 320, 544):
        w = random_qtensor(T.Q8_0, 11, k, seed=k)
        qx = quantize_activations(activations(5, k, seed=k))
        ref = _canonical_q8_0(w, *qx)
        for kern in (gemv, gemm):
            y = np.empty((5, 11), np.float32)
            kern(w.rows(), *qx, y)
            np.testing.assert_array_equal(y, ref)


def test_gemv_token_pairs_exact():
    """gemv's last-group paths — token pairs packed into one vector (<= 4 blocks left) or one token
    per vector (5-7 left) — for even and odd n, match the canonical float order (numpy model, Q8_0)
    and the gemm bit for bit (Q4_0)."""
    for k in (96, 160, 224, 416, 640):  # last group: 3, 5, 7, 5, 4 blocks
        for n in (2, 4, 5, 16):
            qx = quantize_activations(activations(n, k, seed=n + k))
            w = random_qtensor(T.Q8_0, 9, k, seed=k)
            y = np.full((n, 9), np.nan, np.float32)
            mm.kernels_for(T.Q8_0)[0](w.rows(), *qx, y)
            np.testing.assert_array_equal(y, _canonical_q8_0(w, *qx), err_msg=f"Q8_0 k={k} n={n}")
            w = random_qtensor(T.Q4_0, 9, k, seed=k)
            y1 = np.full((n, 9), np.nan, np.float32)
            y2 = np.full((n, 9), np.nan, np.float32)
            mm.kernels_for(T.Q4_0)[0](w.rows(), *qx, y1)
            mm.kernels_for(T.Q4_0)[1](w.rows(), *qx, y2)
            np.testing.assert_array_equal(y1, y2, err_msg=f"Q4_0 k={k} n={n}")


def test_gemm_many_passes():
    """n larger than one pass of token tiles (k=2048 -> 256 tokens a pass) and not a multiple of 16."""
    w = random_qtensor(T.Q8_0, 7, 2048, seed=3)
    x = activations(300, 2048, seed=4)
    err = rel_err(mm.matmul(w, x), x @ reference_dequantize(w).T)
    assert err <= REL_BOUND[T.Q8_0]


def test_exact_on_integer_activations():
    """x already on the int8 grid (one value of 127 per block): quantization is lossless, so the
    kernels must match the float reference to float rounding, not just within 1.5 %."""
    rng = np.random.default_rng(0)
    for qtype in TYPES:
        w = random_qtensor(qtype, 9, 64, seed=1)
        x = rng.integers(-127, 128, size=(20, 64)).astype(np.float32)
        x[:, ::32] = 127.0
        ref = x.astype(np.float64) @ reference_dequantize(w).astype(np.float64).T
        y = mm.matmul(w, x)
        assert rel_err(y, ref) < 1e-5, qtype.name


@pytest.mark.skipif(not vector_ir.USE_VNNI, reason="host has no AVX-512 VNNI")
@pytest.mark.skipif(not nb.config.SLP_VECTORIZE, reason="numba was imported before edged set SLP")
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q5_0, T.IQ4_NL], ids=lambda t: t.name)
def test_gemv_emits_vnni(qtype):
    """The block dot must compile to vpdpbusd (5-6x faster); checked on a serial, uncached copy
    because a parallel kernel's loop body lives in a separate gufunc that inspect_asm omits."""
    f = nb.njit(nogil=True, fastmath=False, cache=False)(matmul_legacy.KERNELS[qtype][0].py_func)
    w = random_qtensor(qtype, 2, 64)
    qx = quantize_activations(activations(1, 64, 0))
    f(w.rows(), *qx, np.zeros((1, 2), np.float32))
    assert "vpdpbusd" in f.inspect_asm(f.signatures[0])


def _gemv_portable_and_vnni(w, qx, kind, use_vnni):
    """y [n, m] from legacy_gemv._rows_dot8 compiled on the chosen codegen path (serial, uncached)."""
    xq = qx[0]
    n, k = xq.shape
    xt = np.empty(((n + 1) // 2, ((k // 32 + 7) // 8) * 512), np.int8)
    legacy_gemv.repack_groups8(xq, xt)
    saved = vector_ir.USE_VNNI
    try:
        vector_ir.USE_VNNI = use_vnni

        @nb.njit(cache=False)
        def gemv(w, xt, xq, xd, xs, y):
            acc = np.empty(8 * xq.shape[0], np.float32)
            for r in range(w.shape[0]):
                legacy_gemv._rows_dot8(w[r], kind, xt, xq, xd, xs, acc, y, r)

        y = np.full((n, w.shape[0]), np.nan, np.float32)
        gemv(w.rows(), xt, *qx, y)
    finally:
        vector_ir.USE_VNNI = saved
    assert ("vpdpbusd" in gemv.inspect_asm(gemv.signatures[0])) == use_vnni
    return y


def _gemm_portable_and_vnni(w, qx, kind, use_vnni):
    """y [n, m] (n <= 16) from legacy_gemm_tile._row_tile_dot_raw8 compiled on the chosen codegen path."""
    n, k = qx[0].shape
    nblk = k // 32
    xi = np.empty((1, nblk * 512), np.int8)
    xdt = np.empty((1, nblk * 16), np.float32)
    xst = np.empty((1, nblk * 16), np.float32)
    matmul_legacy._prepare_tiles(*qx, 0, 1, xi, xdt, xst, kind)
    saved = vector_ir.USE_VNNI
    try:
        vector_ir.USE_VNNI = use_vnni

        @nb.njit(cache=False)
        def tile(w, xi, xdt, xst, y):
            out = np.empty(16, np.float32)
            for r in range(w.shape[0]):
                legacy_gemm_tile._row_tile_dot_raw8(w[r], kind, xi, xdt, xst, out)
                y[:, r] = out[: y.shape[0]]

        y = np.full((n, w.shape[0]), np.nan, np.float32)
        tile(w.rows(), xi[0], xdt[0], xst[0], y)
    finally:
        vector_ir.USE_VNNI = saved
    assert ("vpdpbusd" in tile.inspect_asm(tile.signatures[0])) == use_vnni
    return y


KIND = matmul_legacy.KIND


@pytest.mark.parametrize("grouped", [False, True], ids=["raw", "grouped"])
@pytest.mark.parametrize("use_vnni", [False, True] if vector_ir.USE_VNNI else [False])
@pytest.mark.parametrize("qtype", list(KIND), ids=lambda t: t.name)
def test_raw_decoders_both_paths(qtype, use_vnni, grouped):
    """The in-register block decoders of rows_dot8 (gemv) and row_tile_dot_raw8 (gemm) on each
    codegen path, over raw and grouped rows (legacy_groups.py): correct against the reference,
    and bit-identical to each other (k = 352: one 8-block group and a partial one, raw; k = 384
    grouped: one group and a grouped last group of 4)."""
    m, k, n = 5, 384 if grouped else 352, 3
    w = random_qtensor(qtype, m, k, seed=8)
    x = activations(n, k, seed=9)
    qx = quantize_activations(x)
    wk = mm.for_matmul(w) if grouped else w
    kind = KIND[qtype] + (GROUPED_KINDS if grouped else 0)
    y1 = _gemv_portable_and_vnni(wk, qx, kind, use_vnni)
    y2 = _gemm_portable_and_vnni(wk, qx, kind, use_vnni)
    assert rel_err(y1, x @ reference_dequantize(w).T) <= REL_BOUND[qtype]
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(y1, mm.matmul(w, x))  # the same float order as the cached kernels


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_one_token_rows_give_the_row_dot_bits(qtype):
    """At n = 1 the gemv runs each task's grouped rows in one loop (rows_dot8_one, the lanes in
    registers) where every block is in a group of 8 or a last group of 4. Every split of the
    rows into tasks (one, several, one row each) and the prefetch knob give the raw rows' n = 1
    bits (the row-by-row path), which are the gemm's."""
    for k in (256, 640, 2048):  # whole groups; two and a grouped last group of 4; many groups
        m = 29
        w = random_qtensor(qtype, m, k, seed=k + 3)
        wg = mm.for_matmul(w)
        x = activations(1, k, seed=k)
        want = mm.matmul_knobs(w, x, (0, 0, 0, 0), kernel="gemm")
        np.testing.assert_array_equal(mm.matmul(w, x), want)
        for knobs in ((1, 0, 0, 1), (2, 0, 0, 0), (0, 0, 0, 0), (3, 512, 0, 0), (64, 0, 0, 0)):
            got = mm.matmul_knobs(wg, x, knobs)
            np.testing.assert_array_equal(got, want, err_msg=f"{qtype.name} k={k} {knobs}")


def test_one_token_rows_apply_to_whole_grouped_groups_only():
    """rows_dot8_one serves grouped rows whose blocks are all in groups of 8 or a last group of
    4; raw rows and rows with a raw tail take the row-by-row path."""
    q5 = KIND[T.Q5_0]
    for nblk, whole in ((8, True), (20, True), (64, True), (4, True), (9, False), (3, False), (22, False)):
        assert legacy_gemv.one_token_rows(GROUPED_KINDS + q5, nblk) == whole, nblk
        assert not legacy_gemv.one_token_rows(q5, nblk)


@pytest.mark.parametrize("use_vnni", [False, True] if vector_ir.USE_VNNI else [False])
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_1, T.IQ4_NL], ids=lambda t: t.name)
def test_one_token_rows_both_codegen_paths(qtype, use_vnni):
    """rows_dot8_one compiled on each codegen path (portable and VNNI) gives rows_dot8's bits on
    the same path (k = 384: one group of 8 and a grouped last group of 4; k = 512: two whole),
    over all rows and over a run in the middle (rows outside it untouched)."""
    kind = KIND[qtype] + GROUPED_KINDS
    saved = vector_ir.USE_VNNI
    try:
        vector_ir.USE_VNNI = use_vnni

        @nb.njit(cache=False)
        def both(w, xt, xq, xd, xs, y1, y2, r0, r1):
            acc = np.empty(8, np.float32)
            for r in range(w.shape[0]):
                legacy_gemv._rows_dot8(w[r], kind, xt, xq, xd, xs, acc, y1, r)
            legacy_gemv._rows_dot8_one(w, kind, xt, xd, xs, y2, r0, r1, 0)

        m = 7
        for k in (384, 512):
            wg = mm.for_matmul(random_qtensor(qtype, m, k, seed=k))
            qx = quantize_activations(activations(1, k, seed=k + 1))
            xt = np.empty((1, ((k // 32 + 7) // 8) * 512), np.int8)
            legacy_gemv.repack_groups8(qx[0], xt)
            for r0, r1 in ((0, m), (2, 5)):
                y1 = np.full((1, m), np.nan, np.float32)
                y2 = np.full((1, m), np.nan, np.float32)
                both(wg.rows(), xt, *qx, y1, y2, r0, r1)
                np.testing.assert_array_equal(y2[:, r0:r1], y1[:, r0:r1], err_msg=f"{qtype.name} k={k}")
                assert np.isnan(y2[:, :r0]).all() and np.isnan(y2[:, r1:]).all()
        assert ("vpdpbusd" in both.inspect_asm(both.signatures[0])) == use_vnni
    finally:
        vector_ir.USE_VNNI = saved
