"""The K-quants' row-pair layout (backends/cpu/kquant_pairs.py): rows 2p and 2p + 1 alternate
superblock by superblock in the CPU backend's copy, and every kernel gives the raw rows' bits."""

import sys

import edged.backends.cpu.matmul  # noqa: F401  (first: edged configures numba before its import)
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.embed import embed
from edged.backends.cpu.kquant_pairs import pack_nibbles, pair_rows, unpack_nibbles, unpaired_rows
from edged.backends.cpu.matmul_kquants import KINDS
from edged.quant.dequant import dequantize
from edged.quant.types import traits
from tests.backends.matmul_cases import activations
from tests.helpers.qdata import random_qtensor

mm = sys.modules["edged.backends.cpu.matmul"]
TYPES = list(KINDS)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_pair_layout_and_its_inverse(qtype):
    """Pair p's bytes are row 2p's superblock s then row 2p + 1's, for s in order (Q4_K / Q5_K
    with qs repacked, every other byte as it was); unpaired_rows gives back any rows, in any order,
    repeated."""
    w = random_qtensor(qtype, 6, 768, seed=2)
    raw, bb = w.rows(), traits(qtype).type_size
    p = pair_rows(raw, qtype)
    assert p.shape == raw.shape and p.dtype == np.uint8
    qs = {T.Q4_K: 16, T.Q5_K: 48}.get(qtype)
    for pair in range(3):
        flat = p[2 * pair:2 * pair + 2].reshape(-1)
        for s in range(3):
            for j in range(2):
                got = flat[(2 * s + j) * bb:(2 * s + j + 1) * bb].copy()
                if qs is not None:
                    got[qs:qs + 128] = unpack_nibbles(got[qs:qs + 128])
                np.testing.assert_array_equal(got, raw[2 * pair + j, s * bb:(s + 1) * bb])
    ids = np.array([5, 0, 3, 3, 2])
    np.testing.assert_array_equal(unpaired_rows(p, qtype, ids), raw[ids])


def test_packed_nibbles():
    """pack_nibbles puts element i of 32-block b in the low and element 16 + i in the high nibble
    of byte 16b + i (b = 0..7 over the superblock's 256 elements as GGUF's Q4_K orders them), and
    unpack_nibbles undoes it."""
    qs = np.random.default_rng(0).integers(0, 256, (3, 128), dtype=np.uint8)
    el = np.empty((3, 8, 32), np.uint8)  # [row, 32-block, element] as GGUF's Q4_K stores them
    for h in range(2):
        for half in range(2):
            part = qs[:, 64 * h + 32 * half:64 * h + 32 * half + 32]
            el[:, 4 * h + 2 * half] = part & 0x0F
            el[:, 4 * h + 2 * half + 1] = part >> 4
    packed = pack_nibbles(qs)
    for b in range(8):
        np.testing.assert_array_equal(packed[:, 16 * b:16 * b + 16] & 0x0F, el[:, b, :16])
        np.testing.assert_array_equal(packed[:, 16 * b:16 * b + 16] >> 4, el[:, b, 16:])
    np.testing.assert_array_equal(unpack_nibbles(packed), qs)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_on_row_pairs_is_bit_identical(qtype):
    """for_matmul pairs a K-quant weight with an even row count (and leaves an odd one as it is);
    matmul of the pairs gives the raw weight's bits through the gemv (n = 1, a group of 3 run as
    4, knobs) and the gemm (8- and 16-token tiles, several tiles)."""
    for m, k in ((22, 512), (2, 256), (64, 1024)):
        w = random_qtensor(qtype, m, k, seed=m + k)
        wp = mm.for_matmul(w)
        assert wp.grouped and not w.grouped and wp.qtype == w.qtype and wp.shape == w.shape
        for n in (1, 2, 3, 5, 16, 40):
            x = activations(n, k, seed=n)
            want = mm.matmul(w, x)
            np.testing.assert_array_equal(mm.matmul(wp, x), want, err_msg=f"{qtype.name} {m}x{k} n={n}")
            for kernel, knobs in (("gemv", (3, 1024, 0, 1)), ("gemm", (5, 0, 0, 0))):
                got = mm.matmul_knobs(wp, x, knobs, kernel=kernel)
                np.testing.assert_array_equal(got, mm.matmul_knobs(w, x, knobs, kernel=kernel),
                                              err_msg=f"{qtype.name} {m}x{k} n={n} {kernel}")
    odd = random_qtensor(qtype, 7, 256, seed=1)
    assert mm.for_matmul(odd) is odd


def test_embed_reads_row_pairs_and_dequantize_refuses_them():
    """A tied output projection's paired copy still embeds; dequantize names the layout."""
    w = random_qtensor(T.Q6_K, 10, 512, seed=4)
    wp = mm.for_matmul(w)
    ids = np.array([3, 0, 9, 3, 8])
    np.testing.assert_array_equal(embed(wp, ids), embed(w, ids))
    with pytest.raises(ValueError, match="grouped layout"):
        dequantize(wp)


def test_row_pairs_fuse():
    """The decoder may fuse same-typed K-quant projections (q|k|v, gate|up) on the CPU: the pair
    copy is made anyway."""
    assert all(mm.fuses_rows(qtype) for qtype in TYPES)
    assert not mm.fuses_rows(T.IQ2_XXS)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_experts_in_row_pairs_give_the_raw_bits(qtype):
    """A stack of experts' matrices [n_expert, rows, cols] is paired expert by expert; moe_matmul
    over the pairs (the fused kernel for groups of 1-4 tokens, matmul of the paired slab past
    that) gives the raw stack's bits, gate and up in one call or one weight alone."""
    from edged.backends.cpu.moe_matmul import moe_matmul
    from edged.quant.tensor import QTensor

    ne, m, k = 5, 12, 512
    stacks = [QTensor(name, qtype, (ne, m, k), random_qtensor(qtype, ne * m, k, seed=s, name=name).data)
              for s, name in ((1, "gate"), (2, "up"))]
    paired = [mm.for_matmul(w) for w in stacks]
    assert all(p.grouped and p.shape == w.shape for p, w in zip(paired, stacks))
    assert all(s.grouped for s in paired[0].slabs())
    rows = np.array([2, 0, 1, 3, 4, 5, 6, 0, 1, 2], np.int32)
    experts, cuts = np.array([3, 0, 4]), np.array([0, 1, 4, 10])  # groups of 1, 3 and 6 tokens
    x = activations(7, k, seed=3)
    want = moe_matmul(stacks, x, rows, experts, cuts)
    # both paired, one alone, and gate paired with up raw (the memory guard copied one of them)
    for use in ([paired[0], paired[1]], [paired[1]], [paired[0], stacks[1]]):
        got = moe_matmul(use, x, rows, experts, cuts)
        for g, w in zip(got, want if len(use) == 2 else want[1:]):
            np.testing.assert_array_equal(g, w)
    odd = QTensor("odd", qtype, (ne, 7, k), random_qtensor(qtype, ne * 7, k, seed=4).data)
    assert mm.for_matmul(odd) is odd


def test_host_keeps_the_mapping_when_the_copy_would_not_fit(monkeypatch):
    """The host's upload_matrix copies a weight into its layout (row pairs here) only while the
    copy leaves host_memory's reserve free; past that the weight stays the file's mapping, and
    matmul of it gives the same bits."""
    from edged.backends.cpu import host, host_memory

    w = random_qtensor(T.Q4_K, 8, 256, seed=9)
    ram = {"MemTotal": 64 * 2**30, "MemAvailable": 32 * 2**30}
    monkeypatch.setattr(host_memory, "meminfo_bytes", lambda key: ram[key])
    assert host.upload_matrix(w).grouped
    ram["MemAvailable"] = ram["MemTotal"] // 10 + w.data.nbytes - 1  # one byte short of the reserve
    kept = host.upload_matrix(w)
    assert kept is w
    x = activations(3, 256, seed=1)
    np.testing.assert_array_equal(mm.matmul(kept, x), mm.matmul(mm.for_matmul(w), x))
