"""load_gguf on the default model (checked against gguf.GGUFReader) and on files written here with
gguf.GGUFWriter: every value type, arrays, several tensor types, split files, typed accessors."""

import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType as V, GGUFWriter

from edged.quant import GGUFError, GGUFFile, QTensor, load_gguf
from tests.helpers.model import default_model_path
from tests.helpers.qdata import random_qtensor
from tests.quant.gguf_build import build, gkv

# ---- default model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    path = default_model_path()
    return path, load_gguf(path)


@pytest.fixture(scope="module")
def reader(model):
    # The real model is trusted, so it is safe to hand to GGUFReader. Its pure-Python walk of the
    # 262144-entry vocabulary costs ~10 s of CPU here; paid once per module.
    return GGUFReader(model[0])


def test_default_model_basics(model):
    path, gf = model
    assert isinstance(gf, GGUFFile)
    assert gf.architecture == "gemma3"
    assert gf.version == 3
    assert gf.alignment == 32
    assert gf.file_size == path.stat().st_size
    assert len(gf.tensors) == 236
    assert gf.get_int(gf.arch_key("block_count")) == 18
    assert gf.get_int("gemma3.embedding_length") == 640
    assert gf.get_float("gemma3.rope.freq_base") == 1e6
    assert gf.get_bool("tokenizer.ggml.add_bos_token") is True
    tokens = gf.get_str_list("tokenizer.ggml.tokens")
    assert len(tokens) == 262144 and all(isinstance(t, str) for t in tokens[:100])
    scores = gf.get_array("tokenizer.ggml.scores")
    assert scores.dtype == np.float32 and scores.shape == (262144,) and not scores.flags.writeable


def test_default_model_loads_fast(model):
    path = model[0]
    t0 = time.perf_counter()
    load_gguf(path)
    assert time.perf_counter() - t0 < 1.0  # the brief's bound: "well under 1 s" (measured ~0.15 s)


def test_default_model_tensors_match_reader(model, reader):
    gf, rd = model[1], reader
    assert [t.name for t in rd.tensors] == list(gf.tensors)
    for rt in rd.tensors:
        qt = gf.tensors[rt.name]
        assert isinstance(qt, QTensor)
        assert qt.qtype == rt.tensor_type
        assert qt.shape == tuple(int(d) for d in reversed(rt.shape.tolist()))
        assert qt.data.dtype == np.uint8 and qt.data.nbytes == int(rt.n_bytes)
        assert all(type(d) is int for d in qt.shape)
        assert not qt.data.flags.writeable
    assert gf.tensors["token_embd.weight"].shape == (262144, 640)
    assert gf.tensors["token_embd.weight"].qtype == T.Q8_0
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.17.ffn_down.weight", "output_norm.weight"):
        rt = next(t for t in rd.tensors if t.name == name)
        assert np.array_equal(gf.tensors[name].data, np.asarray(rt.data).reshape(-1).view(np.uint8))


def test_default_model_metadata_matches_reader(model, reader):
    gf, rd = model[1], reader
    keys = [k for k in rd.fields if not k.startswith("GGUF.")]
    assert keys == list(gf.metadata)
    for k in keys:
        f = rd.fields[k]
        mine = gf.metadata[k]
        if f.types[0] == V.ARRAY:
            assert gf.metadata_types[k] == (V.ARRAY, f.types[-1])
            theirs = f.contents()
            if f.types[-1] == V.STRING:
                assert mine == theirs, k
            else:
                assert np.array_equal(mine, np.asarray(theirs, dtype=mine.dtype)), k
        else:
            assert gf.metadata_types[k] == f.types[0]
            assert mine == f.contents() and type(mine) is type(f.contents()), k


def test_tensor_views_keep_mmap_alive():
    path = default_model_path()
    t = load_gguf(path).tensors["output_norm.weight"]  # the GGUFFile itself is dropped here
    assert t.data.view(np.float32).shape == (640,)
    assert np.isfinite(t.data.view(np.float32)).all()


# ---- GGUFWriter round trip ---------------------------------------------------------------------

_SCALARS = [
    ("t.u8", V.UINT8, 200), ("t.i8", V.INT8, -100), ("t.u16", V.UINT16, 60000), ("t.i16", V.INT16, -30000),
    ("t.u32", V.UINT32, 4_000_000_000), ("t.i32", V.INT32, -2_000_000_000), ("t.f32", V.FLOAT32, 0.5),
    ("t.u64", V.UINT64, 2**64 - 1), ("t.i64", V.INT64, -(2**63)), ("t.f64", V.FLOAT64, 1e300),
    ("t.bool", V.BOOL, False), ("t.str", V.STRING, "héllo ✓"),
]
_TENSOR_TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.IQ4_XS]


def _write(path: Path, tensors: list[QTensor], extra=None, alignment=None) -> None:
    w = GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_name("roundtrip")
    w.add_context_length(256)
    for key, vt, val in _SCALARS:
        w.add_key_value(key, val, vt)
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_key_value("t.arr_u8", [0, 255, 7], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("t.arr_f64", [0.25, -1.5], V.ARRAY, sub_type=V.FLOAT64)
    w.add_array("t.arr_str", ["a", "", "ünï"])
    w.add_key_value("t.arr_bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    for k, (vt, v) in (extra or {}).items():
        w.add_key_value(k, v, vt)
    for qt in tensors:
        w.add_tensor(qt.name, qt.rows(), raw_dtype=qt.qtype)  # byte rows; the writer derives the shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tensors(seed=0) -> list[QTensor]:
    return [random_qtensor(qt, 3, 256, seed=seed + i, name=f"w.{qt.name.lower()}") for i, qt in enumerate(_TENSOR_TYPES)]


@pytest.mark.parametrize("alignment", [None, 64])
def test_writer_round_trip(tmp_path, alignment):
    p = tmp_path / "rt.gguf"
    ts = _tensors()
    _write(p, ts, alignment=alignment)
    gf = load_gguf(p)
    assert gf.architecture == "llama" and gf.get_str("general.name") == "roundtrip"
    assert gf.alignment == (alignment or 32)
    for key, vt, val in _SCALARS:
        assert gf.metadata_types[key] == vt
        got = gf.metadata[key]
        assert (got == pytest.approx(val) if vt == V.FLOAT32 else got == val), key
        assert type(got) is type(val), key
    assert gf.metadata_types["t.arr_i32"] == (V.ARRAY, V.INT32)
    assert gf.get_array("t.arr_i32").tolist() == [1, -2, 3]
    assert gf.get_array("t.arr_u8").dtype == np.uint8 and gf.get_array("t.arr_u8").tolist() == [0, 255, 7]
    assert gf.get_array("t.arr_f64").tolist() == [0.25, -1.5]
    assert gf.get_array("t.arr_bool").tolist() == [True, False, True]
    assert gf.get_str_list("t.arr_str") == ["a", "", "ünï"]
    assert list(gf.tensors) == [t.name for t in ts]
    for t in ts:
        got = gf.tensors[t.name]
        assert got.qtype == t.qtype and got.shape == t.shape
        assert np.array_equal(got.data, t.data)
        # the mmap starts on a page boundary, so an aligned file offset gives an aligned address
        assert got.data.ctypes.data % gf.alignment == 0


def test_low_bit_tensors_load(tmp_path):
    # an IQ2_XXS weight and MXFP4 experts stacked 3-D (gpt-oss's ffn_*_exps layout) written by gguf-py
    from edged.quant import dequantize
    from tests.helpers.qdata import reference_dequantize

    iq2 = random_qtensor(T.IQ2_XXS, 4, 512, seed=1, name="blk.0.attn_q.weight")
    mx = random_qtensor(T.MXFP4, 2 * 3, 64, seed=2, name="blk.0.ffn_up_exps.weight")
    p = tmp_path / "lowbit.gguf"
    w = GGUFWriter(p, "llama")
    w.add_tensor(iq2.name, iq2.rows(), raw_dtype=T.IQ2_XXS)  # uint8 [4, 132]: the writer derives [4, 512]
    w.add_tensor(mx.name, mx.rows().reshape(2, 3, -1), raw_dtype=T.MXFP4)  # uint8 [2, 3, 34] -> [2, 3, 64]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with load_gguf(p) as gf:
        got_iq2, got_mx = gf.tensors[iq2.name], gf.tensors[mx.name]
        assert got_iq2.qtype == T.IQ2_XXS and got_iq2.shape == (4, 512)
        assert got_mx.qtype == T.MXFP4 and got_mx.shape == (2, 3, 64)
        assert np.array_equal(got_iq2.data, iq2.data) and np.array_equal(got_mx.data, mx.data)
        np.testing.assert_array_equal(dequantize(got_iq2), reference_dequantize(iq2))
        np.testing.assert_array_equal(dequantize(got_mx.slab(1)), reference_dequantize(mx)[3:6])


def test_empty_arrays_and_no_tensors(tmp_path):
    # GGUFWriter refuses empty arrays, so this file is built byte by byte.
    kvs = [
        gkv("general.architecture", V.STRING, "llama"),
        gkv("t.empty_i32", V.ARRAY, [], V.INT32),
        gkv("t.empty_str", V.ARRAY, [], V.STRING),
    ]
    p = tmp_path / "empty.gguf"
    p.write_bytes(build(kvs, [], []).data)
    gf = load_gguf(p)
    assert gf.tensors == {}
    assert gf.get_array("t.empty_i32").shape == (0,) and gf.get_array("t.empty_i32").dtype == np.int32
    assert gf.get_str_list("t.empty_str") == []


def test_accessors_check_types(tmp_path):
    p = tmp_path / "acc.gguf"
    _write(p, _tensors()[:1])
    gf = load_gguf(p)
    assert gf.get_int("t.u64") == 2**64 - 1 and gf.get_int("t.i8") == -100
    assert gf.get_float("t.f64") == 1e300 and gf.get_float("t.u8") == 200.0
    assert isinstance(gf.get_float("t.u8"), float)
    assert gf.get_bool("t.bool") is False
    assert gf.get_str("t.str") == "héllo ✓"
    assert gf.arch_key("context_length") == "llama.context_length"
    assert gf.get_int(gf.arch_key("context_length")) == 256
    assert gf.get_int("missing.key", 7) == 7 and gf.get_str("missing.key", None) is None
    with pytest.raises(GGUFError, match="missing.key.*missing"):
        gf.get_int("missing.key")
    cases = [
        (gf.get_int, "t.str", "STRING"), (gf.get_int, "t.bool", "BOOL"), (gf.get_int, "t.f32", "FLOAT32"),
        (gf.get_str, "t.u32", "UINT32"), (gf.get_float, "t.str", "STRING"), (gf.get_bool, "t.u8", "UINT8"),
        (gf.get_str_list, "t.arr_i32", "ARRAY of INT32"), (gf.get_array, "t.arr_str", "ARRAY of STRING"),
        (gf.get_array, "t.u32", "UINT32"),
    ]
    for fn, key, stored in cases:
        with pytest.raises(GGUFError) as ei:
            fn(key)
        msg = str(ei.value)
        assert key in msg and f"stored as {stored}" in msg and "expected" in msg, msg


def test_context_manager(tmp_path):
    p = tmp_path / "cm.gguf"
    _write(p, _tensors()[:2])
    with load_gguf(p) as gf:
        t = gf.tensors["w.f32"]
    assert gf.tensors == {}
    assert t.data.view(np.float32).shape == (3 * 256,)  # still readable: the view holds the mmap


# ---- split files -------------------------------------------------------------------------------


def _write_splits(tmp_path: Path, n_parts: int, name="model") -> tuple[list[Path], list[QTensor]]:
    ts = _tensors(seed=10)
    chunks = [ts[i::n_parts] for i in range(n_parts)]
    paths = []
    for i, chunk in enumerate(chunks):
        p = tmp_path / f"{name}-{i + 1:05d}-of-{n_parts:05d}.gguf"
        w = GGUFWriter(p, "llama")
        if i == 0:
            w.add_name("split model")
            w.add_block_count(2)
        w.add_key_value("split.no", i, V.UINT16)
        w.add_key_value("split.count", n_parts, V.UINT16)
        w.add_key_value("split.tensors.count", len(ts), V.INT32)
        for qt in chunk:
            w.add_tensor(qt.name, qt.rows(), raw_dtype=qt.qtype)  # byte rows; the writer derives the shape
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(p)
    return paths, ts


@pytest.mark.parametrize("n_parts", [2, 3])
def test_split_files_load_as_one(tmp_path, n_parts):
    paths, ts = _write_splits(tmp_path, n_parts)
    for which in paths:  # any part loads the whole model
        gf = load_gguf(which)
        assert gf.path == paths[0] and gf.paths == paths
        assert gf.get_str("general.name") == "split model"
        assert gf.get_int("llama.block_count") == 2
        assert gf.file_size == sum(p.stat().st_size for p in paths)
        assert sorted(gf.tensors) == sorted(t.name for t in ts)
        for t in ts:
            assert np.array_equal(gf.tensors[t.name].data, t.data) and gf.tensors[t.name].shape == t.shape


def test_split_missing_part(tmp_path):
    paths, _ = _write_splits(tmp_path, 3)
    paths[1].unlink()
    for p in (paths[0], paths[2]):
        with pytest.raises(GGUFError, match="missing part"):
            load_gguf(p)


def test_split_bad_part_is_reported(tmp_path):
    paths, _ = _write_splits(tmp_path, 2)
    data = bytearray(paths[1].read_bytes())
    paths[1].write_bytes(bytes(data[:100]))
    with pytest.raises(GGUFError) as ei:
        load_gguf(paths[0])
    assert str(paths[1]) in str(ei.value)


def test_split_count_mismatch(tmp_path):
    paths, _ = _write_splits(tmp_path, 2)
    # Renamed to claim three parts while the metadata says two.
    renamed = [p.with_name(p.name.replace("-of-00002", "-of-00003")) for p in paths]
    for a, b in zip(paths, renamed):
        a.rename(b)
    third = renamed[0].with_name("model-00003-of-00003.gguf")
    third.write_bytes(renamed[1].read_bytes())
    with pytest.raises(GGUFError, match="split.count.*2 parts declared"):
        load_gguf(renamed[0])


def test_split_duplicate_tensor_across_parts(tmp_path):
    ts = _tensors()[:1]
    paths = []
    for i in range(2):
        p = tmp_path / f"dup-{i + 1:05d}-of-00002.gguf"
        w = GGUFWriter(p, "llama")
        w.add_key_value("split.no", i, V.UINT16)
        w.add_key_value("split.count", 2, V.UINT16)
        for qt in ts:
            w.add_tensor(qt.name, qt.rows(), raw_dtype=qt.qtype)  # byte rows; the writer derives the shape
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(p)
    with pytest.raises(GGUFError, match="another split part"):
        load_gguf(paths[0])


def test_unsplit_name_with_split_metadata(tmp_path):
    p = tmp_path / "plain.gguf"
    _write(p, _tensors()[:1], extra={"split.count": (V.UINT16, 3)})
    with pytest.raises(GGUFError, match="split.count"):
        load_gguf(p)
