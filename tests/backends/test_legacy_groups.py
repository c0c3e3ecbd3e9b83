"""The grouped layout of the 32-element block types (backends/cpu/legacy_groups.py): a lossless
regrouping of each row, on which the kernels give the raw rows' bits."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.embed import embed
from edged.backends.cpu.legacy_blocks import GROUPED_KINDS
from edged.backends.cpu.legacy_gemm_quad import direct_q8_0
from edged.backends.cpu.legacy_groups import group_rows, ungroup_rows
from edged.backends.cpu.matmul_legacy import KIND
from edged.quant.dequant import dequantize
from tests.backends.matmul_cases import activations
from tests.helpers.qdata import random_qtensor

mm = sys.modules["edged.backends.cpu.matmul"]
TYPES = list(KIND)
# blocks per row: 1, 3 (raw tails), 8, 9 (a raw tail of 1), 20 (two groups and a grouped 4), 64
KS = (32, 96, 256, 288, 640, 2048)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_round_trip_and_what_moves(qtype):
    """ungroup(group(rows)) is the rows; whole groups and a last group of 4 change, a raw tail
    (a last group of neither 8 nor 4) does not."""
    for k in KS:
        w = random_qtensor(qtype, 5, k, seed=k)
        raw = w.rows()
        g = group_rows(raw, KIND[qtype])
        assert g.shape == raw.shape and g.dtype == np.uint8
        np.testing.assert_array_equal(ungroup_rows(g, KIND[qtype]), raw)
        nblk, size = k // 32, raw.shape[1] // (k // 32)
        kept = nblk % 8 if nblk % 8 != 4 else 0  # blocks left raw at the row's end
        moved = (nblk - kept) * size
        assert not np.array_equal(g[:, :moved], raw[:, :moved]) or moved == 0, k
        np.testing.assert_array_equal(g[:, moved:], raw[:, moved:])


def test_fifth_bits_and_scales_land_in_their_fields():
    """Q5_1, the type with every field: the group's first bytes are the 8 blocks' d, then their
    mins, then word g of the fifth bits holds element 4g+q of block j at bit 4j+q."""
    w = random_qtensor(T.Q5_1, 1, 256, seed=3)
    blocks = w.rows().reshape(8, 24)
    g = group_rows(w.rows(), KIND[T.Q5_1])[0]
    np.testing.assert_array_equal(g[:16].reshape(8, 2), blocks[:, 0:2])
    np.testing.assert_array_equal(g[16:32].reshape(8, 2), blocks[:, 2:4])
    qh = blocks[:, 4:8].copy().view("<u4")[:, 0]  # [8 blocks]
    words = g[32:64].copy().view("<u4")  # [8 words]
    for gi in range(8):
        for j in range(8):
            for q in range(4):
                assert (words[gi] >> (4 * j + q)) & 1 == (qh[j] >> (4 * gi + q)) & 1


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_on_grouped_rows_is_bit_identical(qtype):
    """matmul of mm.for_matmul(w) (the grouped copy the CPU backend runs on) gives the raw
    weight's bits, through the gemv (n = 1, token pairs, an odd last token) and the gemm (a
    partial tile, several tiles)."""
    for k in (96, 288, 640, 2048):
        w = random_qtensor(qtype, 19, k, seed=k + 1)
        wg = mm.for_matmul(w)
        assert wg.grouped and not w.grouped and wg.qtype == w.qtype and wg.shape == w.shape
        for n in (1, 2, 3, 17, 24, 25, 40):
            x = activations(n, k, seed=n)
            np.testing.assert_array_equal(mm.matmul(wg, x), mm.matmul(w, x), err_msg=f"{qtype.name} k={k} n={n}")


def test_types_without_a_cpu_layout_stay_as_loaded():
    """for_matmul leaves types without a CPU layout of their own (and weights already in one)
    alone (the K-quants' row pairs: tests/backends/test_kquant_pairs.py)."""
    for qtype in (T.IQ2_XXS, T.F16):
        w = random_qtensor(qtype, 4, 256, seed=1)
        assert mm.for_matmul(w) is w
    w = mm.for_matmul(random_qtensor(T.Q8_0, 4, 256, seed=1))
    assert mm.for_matmul(w) is w


def test_embed_reads_grouped_rows_and_dequantize_refuses_them():
    """A tied output projection's grouped copy still embeds; dequantize names the layout."""
    w = random_qtensor(T.Q5_0, 12, 640, seed=4)
    wg = mm.for_matmul(w)
    ids = np.array([3, 0, 11, 3])
    np.testing.assert_array_equal(embed(wg, ids), embed(w, ids))
    with pytest.raises(ValueError, match="grouped layout"):
        dequantize(wg)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemm_row_quads_give_the_gemv_bits(qtype):
    """The gemm's decoded row quads (legacy_gemm_quad, every tile count with mode 0; from two
    tiles on with mode 1), grouped Q8_0 quads read in place (one tile: k = 128, 512, 640, 896) and the
    in-tile decode (one tile, mode 1) give each token the bits of its own n = 1 gemv, raw and
    grouped, on k with whole groups only, a grouped 4 and a raw tail, and m = 4·q + 3 (a pair
    and a single row after the quads)."""
    for k in (96, 128, 288, 512, 640, 896):
        w = random_qtensor(qtype, 23, k, seed=k + 7)
        for wt in (w, mm.for_matmul(w)):
            for n in (16, 21, 40):
                x = activations(n, k, seed=n + k)
                want = np.concatenate([mm.matmul(wt, x[t:t + 1]) for t in range(n)])
                for knobs in ((0, 0, 0, 0), (0, 0, 1, 0), (5, 512, 0, 0), (0, -1, 0, 0)):
                    got = mm.matmul_knobs(wt, x, knobs, kernel="gemm")
                    np.testing.assert_array_equal(got, want, err_msg=f"{qtype.name} k={k} n={n} {knobs}")


def test_only_whole_grouped_q8_0_rows_are_read_in_place():
    """The quads read grouped Q8_0 rows in place only where every block is in a group of 8 or a
    last group of 4 (their words then are the decoded layout); other rows and types decode."""
    q8, q5 = KIND[T.Q8_0], KIND[T.Q5_0]
    for nblk, whole in ((16, True), (20, True), (28, True), (4, True), (9, False), (3, False), (22, False)):
        assert direct_q8_0(GROUPED_KINDS + q8, nblk) == whole, nblk
        assert not direct_q8_0(q8, nblk) and not direct_q8_0(GROUPED_KINDS + q5, nblk)


@pytest.mark.parametrize("nt", (16, 5))
def test_store_quad_writes_each_token_four_floats(nt):
    """store_quad puts a quad's [4 rows, 16 tokens] results at y[t0 + t, col : col + 4] for the
    first nt tokens and touches nothing else of y."""
    import numba as nb

    from edged.backends.cpu.tile_store import store_quad

    @nb.njit
    def put(acc, y, t0, nt, col):
        store_quad(acc, y, t0, nt, col)

    acc = np.arange(64, dtype=np.float32) + 0.5  # [4 rows, 16 tokens]
    y = np.full((20, 11), -1.0, np.float32)
    put(acc, y, 3, nt, 6)
    want = np.full((20, 11), -1.0, np.float32)
    want[3:3 + nt, 6:10] = acc.reshape(4, 16).T[:nt]
    np.testing.assert_array_equal(y, want)
