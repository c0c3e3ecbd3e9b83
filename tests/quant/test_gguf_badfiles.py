"""Crafted bad-file corpus: every malformed file raises GGUFError within HANG_S, nothing else escapes.

The bound is a robustness check (no hang, no huge allocation), not a speed benchmark."""

import struct
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

from edged.quant import GGUFError, load_gguf
from tests.quant.gguf_build import build, gkv, gstr, gtensor_info, small_model

HUGE = (1 << 64) - 1
_EXTREMES = [0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]
ARCH = gkv("general.architecture", V.STRING, "llama")
# seconds a bad file may take to be refused: loads take milliseconds, but one of the byte sweep's
# thousands took 1.5 s on a 2-core VM under a full CI run (a stall, not the loader)
HANG_S = 5.0


def expect_error(tmp_path, data: bytes, match: str | None = None, name: str = "bad.gguf") -> GGUFError:
    """Writes `data`, loads it, asserts a GGUFError (anything else fails the test) within HANG_S."""
    p = tmp_path / name
    p.write_bytes(data)
    t0 = time.perf_counter()
    with pytest.raises(GGUFError) as ei:
        load_gguf(p)
    dt = time.perf_counter() - t0
    assert dt < HANG_S, f"took {dt:.2f} s"
    assert str(p) in str(ei.value)
    if match is not None:
        assert match in str(ei.value), str(ei.value)
    return ei.value


def f32_file(dims=(4,), qtype=T.F32, offset=0, data=bytes(16), kvs=None, **kw) -> bytes:
    return build(kvs if kvs is not None else [ARCH], [gtensor_info("t", dims, qtype, offset)], [data], **kw).data


def test_small_model_is_valid(tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(small_model().data)
    gf = load_gguf(p)
    assert gf.architecture == "llama" and len(gf.tensors) == 3


# ---- truncation -------------------------------------------------------------------------------


def test_truncation_at_every_section_boundary(tmp_path):
    b = small_model()
    cuts = sorted(set(b.boundaries.values()) | {0, 1, 3})
    assert len(cuts) > 12
    for cut in cuts:
        expect_error(tmp_path, b.data[:cut])


def test_truncation_sweep_through_every_byte(tmp_path):
    # The last tensor ends the file, so every shorter prefix is invalid.
    data = small_model().data
    for cut in range(len(data)):
        expect_error(tmp_path, data[:cut])


def test_empty_and_tiny_files(tmp_path):
    expect_error(tmp_path, b"", "truncated")
    expect_error(tmp_path, b"GG", "truncated")
    expect_error(tmp_path, b"GGUF\x03\x00\x00\x00", "truncated")


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        load_gguf(tmp_path / "nope.gguf")


# ---- header ------------------------------------------------------------------------------------


def test_bad_magic(tmp_path):
    data = small_model().data
    expect_error(tmp_path, b"GGML" + data[4:], "header.magic")
    expect_error(tmp_path, b"\x00" * 64, "header.magic")


@pytest.mark.parametrize("version", [0, 1, 4, 2**32 - 1, 0x03000000])
def test_bad_version(tmp_path, version):
    data = bytearray(small_model().data)
    data[4:8] = struct.pack("<I", version)
    expect_error(tmp_path, bytes(data), "header.version")


@pytest.mark.parametrize("n", [HUGE, 1 << 63, 1 << 40, 1000])
def test_huge_tensor_count(tmp_path, n):
    expect_error(tmp_path, build([ARCH], [], [], n_tensors=n).data, "n_tensors")


@pytest.mark.parametrize("n", [HUGE, 1 << 63, 1 << 40, 1000])
def test_huge_kv_count(tmp_path, n):
    expect_error(tmp_path, build([ARCH], [], [], n_kv=n).data, "n_kv")


# ---- key/value records -------------------------------------------------------------------------


def test_huge_string_lengths(tmp_path):
    huge_key = struct.pack("<Q", HUGE) + b"abc" + bytes(16)
    expect_error(tmp_path, build([huge_key], [], []).data, "string length")
    huge_val = gkv("general.name", V.STRING, raw=struct.pack("<Q", 1 << 62) + b"x" * 8)
    expect_error(tmp_path, build([ARCH, huge_val], [], []).data, "string length")
    huge_name = struct.pack("<Q", HUGE) + bytes(40)
    expect_error(tmp_path, build([ARCH], [huge_name], []).data, "string length")


@pytest.mark.parametrize("elem", [V.UINT8, V.FLOAT64, V.STRING, V.ARRAY, V.BOOL])
@pytest.mark.parametrize("count", [HUGE, 1 << 63, 1 << 20])
def test_huge_array_length(tmp_path, elem, count):
    kv = gkv("x.arr", V.ARRAY, raw=struct.pack("<IQ", int(elem), count) + bytes(32))
    expect_error(tmp_path, build([ARCH, kv], [], []).data, "x.arr")


def test_deep_nesting(tmp_path):
    # array of array of array of uint8 (depth 3): rejected; depth 2 is allowed.
    inner = struct.pack("<IQ", int(V.UINT8), 1) + b"\x05"
    mid = struct.pack("<IQ", int(V.ARRAY), 1) + inner
    deep = gkv("x.deep", V.ARRAY, raw=struct.pack("<IQ", int(V.ARRAY), 1) + mid)
    expect_error(tmp_path, build([ARCH, deep], [], []).data, "nested")
    # A very deep chain (would blow the recursion limit of a naive reader).
    chain = struct.pack("<IQ", int(V.UINT8), 0)
    for _ in range(5000):
        chain = struct.pack("<IQ", int(V.ARRAY), 1) + chain
    expect_error(tmp_path, build([ARCH, gkv("x.chain", V.ARRAY, raw=chain)], [], []).data, "nested")


def test_two_level_array_is_allowed(tmp_path):
    kv = gkv("x.nested", V.ARRAY, [(V.INT32, [1, 2]), (V.STRING, ["a"])], V.ARRAY)
    p = tmp_path / "ok.gguf"
    p.write_bytes(build([ARCH, kv], [], []).data)
    gf = load_gguf(p)
    assert gf.metadata_types["x.nested"] == (V.ARRAY, V.ARRAY)
    assert list(gf.metadata["x.nested"][0]) == [1, 2] and gf.metadata["x.nested"][1] == ["a"]


def test_unknown_value_type(tmp_path):
    expect_error(tmp_path, build([ARCH, gkv("x.k", 13, raw=bytes(8))], [], []).data, "unknown value type 13")
    expect_error(tmp_path, build([ARCH, gkv("x.k", V.ARRAY, raw=struct.pack("<IQ", 99, 1))], [], []).data, "unknown value type 99")


def test_bool_out_of_range(tmp_path):
    expect_error(tmp_path, build([ARCH, gkv("x.b", V.BOOL, raw=b"\x02")], [], []).data, "bool")
    expect_error(tmp_path, build([ARCH, gkv("x.b", V.ARRAY, raw=struct.pack("<IQ", int(V.BOOL), 3) + b"\x00\x01\x07")], [], []).data, "bool")


def test_duplicate_keys(tmp_path):
    kvs = [ARCH, gkv("x.k", V.UINT32, 1), gkv("x.k", V.UINT32, 2)]
    expect_error(tmp_path, build(kvs, [], []).data, "duplicate key")


def test_invalid_utf8(tmp_path):
    expect_error(tmp_path, build([ARCH, gkv(b"x.\xff", V.UINT8, 1)], [], []).data, "UTF-8")
    expect_error(tmp_path, build([ARCH, gkv("x.s", V.STRING, b"\xc3\x28")], [], []).data, "UTF-8")
    arr = struct.pack("<IQ", int(V.STRING), 2) + gstr("ok") + gstr(b"\xed\xa0\x80")  # surrogate
    expect_error(tmp_path, build([ARCH, gkv("tokenizer.ggml.tokens", V.ARRAY, raw=arr)], [], []).data, "UTF-8")
    expect_error(tmp_path, build([ARCH], [gtensor_info(b"t\xfe", (4,), T.F32, 0)], [bytes(16)]).data, "UTF-8")


def test_wrong_value_type_for_keys_edged_reads(tmp_path):
    expect_error(tmp_path, build([gkv("general.architecture", V.UINT32, 7)], [], []).data, "general.architecture")
    expect_error(tmp_path, build([], [], []).data, "general.architecture")  # missing
    bad_ctx = gkv("llama.context_length", V.STRING, "long")
    expect_error(tmp_path, build([ARCH, bad_ctx], [], []).data, "llama.context_length")
    bad_tokens = gkv("tokenizer.ggml.tokens", V.ARRAY, [1, 2], V.INT32)
    expect_error(tmp_path, build([ARCH, bad_tokens], [], []).data, "tokenizer.ggml.tokens")
    bad_scores = gkv("tokenizer.ggml.scores", V.ARRAY, ["a"], V.STRING)
    expect_error(tmp_path, build([ARCH, bad_scores], [], []).data, "tokenizer.ggml.scores")


# ---- alignment ---------------------------------------------------------------------------------


@pytest.mark.parametrize("alignment", [0, 3, 48, 1 << 21, 2**32 - 1])
def test_bad_alignment(tmp_path, alignment):
    kvs = [ARCH, gkv("general.alignment", V.UINT32, alignment)]
    expect_error(tmp_path, build(kvs, [], []).data, "general.alignment")


@pytest.mark.parametrize("vtype,value", [(V.UINT64, 32), (V.INT32, 32), (V.UINT16, 32), (V.STRING, "32")])
def test_alignment_wrong_type(tmp_path, vtype, value):
    kvs = [ARCH, gkv("general.alignment", vtype, value)]
    expect_error(tmp_path, build(kvs, [], []).data, "expected UINT32")


# ---- tensor infos ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_n_dims(tmp_path, n_dims):
    ti = gstr("t") + struct.pack("<I", n_dims) + struct.pack("<4Q", 4, 1, 1, 1) + struct.pack("<IQ", 0, 0)
    expect_error(tmp_path, build([ARCH], [ti], [bytes(16)]).data, "n_dims")


@pytest.mark.parametrize("dims", [(0,), (4, 0), (4, 1, 1, 0)])
def test_zero_dim(tmp_path, dims):
    expect_error(tmp_path, f32_file(dims=dims), "dimension of 0")


@pytest.mark.parametrize(
    "dims",
    [
        (2**42 + 1,),
        (2**42 + 1, 2**42 + 1),
        (2**32, 2**32, 2**32),  # element product 2^96: wraps past 2^64 in uint64 maths
        (2**63, 2**63, 2**63, 2**63),
        (HUGE, HUGE, HUGE, HUGE),
        (2**62, 4),  # product 2^64 exactly: wraps to 0 in uint64
    ],
)
def test_huge_dims(tmp_path, dims):
    expect_error(tmp_path, f32_file(dims=dims), "past the end")


def test_row_not_multiple_of_block(tmp_path):
    expect_error(tmp_path, f32_file(dims=(33, 1), qtype=T.Q8_0, data=bytes(68)), "block size")


def test_unknown_tensor_type(tmp_path):
    err = expect_error(tmp_path, f32_file(qtype=999), "unknown tensor type 999")
    assert "'t'" in str(err)


@pytest.mark.parametrize("qtype", [T.Q8_1, T.Q8_K, T.F64, T.I8, T.I32])
def test_known_but_unsupported_type(tmp_path, qtype):
    err = expect_error(tmp_path, f32_file(dims=(256,), qtype=qtype, data=bytes(2048)), f"unsupported type {qtype.name}")
    assert "'t'" in str(err)


def test_duplicate_tensor_names(tmp_path):
    tis = [gtensor_info("t", (8,), T.F32, 0), gtensor_info("t", (8,), T.F32, 32)]
    expect_error(tmp_path, build([ARCH], tis, [bytes(32), bytes(32)]).data, "duplicate tensor")


# ---- tensor data placement ---------------------------------------------------------------------


@pytest.mark.parametrize("offset", [32, 1 << 20, 2**64 - 32])
def test_offset_past_eof(tmp_path, offset):
    expect_error(tmp_path, f32_file(offset=offset), "past the end")


def test_data_partly_past_eof(tmp_path):
    expect_error(tmp_path, f32_file(dims=(8,), data=bytes(16)), "past the end")


def test_overlapping_tensors(tmp_path):
    tis = [gtensor_info("a", (16,), T.F32, 0), gtensor_info("b", (8,), T.F32, 32)]
    expect_error(tmp_path, build([ARCH], tis, [bytes(64), bytes(32)], offsets=[0, 32]).data, "overlaps")
    same = [gtensor_info("a", (8,), T.F32, 0), gtensor_info("b", (8,), T.F32, 0)]
    expect_error(tmp_path, build([ARCH], same, [bytes(32), bytes(32)], offsets=[0, 0]).data, "overlaps")


@pytest.mark.parametrize("offset", [1, 16, 33])
def test_misaligned_offset(tmp_path, offset):
    expect_error(tmp_path, build([ARCH], [gtensor_info("t", (4,), T.F32, offset)], [bytes(16)], offsets=[offset]).data, "alignment")


def test_misaligned_with_custom_alignment(tmp_path):
    kvs = [ARCH, gkv("general.alignment", V.UINT32, 64)]
    ti = gtensor_info("t", (4,), T.F32, 32)  # aligned to 32 but not 64
    expect_error(tmp_path, build(kvs, [ti], [bytes(16)], alignment=64, offsets=[32]).data, "alignment 64")


# ---- the gguf 0.19.0 hang ----------------------------------------------------------------------


def _hang_file() -> bytes:
    """Header with one KV: empty key, ARRAY of UINT8, count 2^63, no elements. gguf 0.19.0's
    GGUFReader reads array elements past EOF as empty arrays without error and never advances, so it
    loops 2^63 times (measured: no return in 5 s, memory growing). That needs 48 bytes."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("") + struct.pack("<IIQ", int(V.ARRAY), int(V.UINT8), 1 << 63)


def test_reader_hang_input(tmp_path):
    data = _hang_file()
    assert len(data) == 48
    expect_error(tmp_path, data, "array of")


def test_43_byte_input(tmp_path):
    # The same header cut to 43 bytes (the size): the array count itself is truncated.
    # Variants: string-array element type, and a key/array header ending mid-count.
    data = _hang_file()[:43]
    assert len(data) == 43
    expect_error(tmp_path, data, "truncated")
    alt = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("abc") + struct.pack("<II", int(V.ARRAY), int(V.STRING)))
    assert len(alt) == 43
    expect_error(tmp_path, alt, "truncated")


# ---- fuzz --------------------------------------------------------------------------------------


def test_random_mutation_fuzz(tmp_path):
    """Bit flips, byte overwrites with extreme values, and truncations of a small valid file: each
    case loads or raises GGUFError, within 1 s."""
    base = small_model().data
    rng = np.random.default_rng(1234)
    p = tmp_path / "fuzz.gguf"
    n_loaded = n_err = 0
    for i in range(400):
        data = bytearray(base)
        kind = i % 4
        if kind == 0:  # 1-4 bit flips anywhere in the metadata/info area
            for _ in range(rng.integers(1, 5)):
                pos = int(rng.integers(0, 400))
                data[pos] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:  # an 8-byte field overwritten by an extreme value
            pos = int(rng.integers(0, 392))
            data[pos : pos + 8] = struct.pack("<Q", _EXTREMES[int(rng.integers(0, len(_EXTREMES)))])
        elif kind == 2:  # random byte overwrite + truncation
            data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
            data = data[: int(rng.integers(0, len(data) + 1))]
        else:  # random bytes spliced in
            pos = int(rng.integers(0, 400))
            data[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
        p.write_bytes(bytes(data))
        t0 = time.perf_counter()
        try:
            load_gguf(p)
            n_loaded += 1
        except GGUFError:
            n_err += 1
        assert time.perf_counter() - t0 < 1.0, f"case {i} took too long"
    assert n_err > 100 and n_loaded > 10  # both outcomes really occur
