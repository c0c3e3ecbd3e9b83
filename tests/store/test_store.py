"""ModelStore: import (single and split files), list/get/resolve/remove, and what stays hidden:
incomplete or malformed entries, failed imports, leftovers of dead writers."""

import hashlib
import json
import math
import os
import subprocess
import sys

import pytest

from edged.quant import load_gguf
from edged.store import ModelNotFoundError, ModelStore, StoreError, default_store_root
from tests.helpers.tiny_models import write_tiny_model
from tests.store.helpers import write_split_tiny_model


@pytest.fixture
def store(tmp_path):
    return ModelStore(tmp_path / "store")


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGED_MODELS", str(tmp_path / "m"))
    assert default_store_root() == tmp_path / "m"
    monkeypatch.delenv("EDGED_MODELS")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_root() == tmp_path / "xdg" / "edged" / "models"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_root() == tmp_path / "home" / ".local" / "share" / "edged" / "models"


def test_import_list_get_resolve_remove(store, tmp_path):
    src = write_tiny_model(tmp_path / "Tiny-Llama.Q8.gguf", "llama")
    m = store.import_path(src)
    assert m.name == "tiny-llama.q8:latest"  # the file stem, lower-cased
    assert m.architecture == "llama" and m.context_length == 256 and m.chat_template is False
    assert m.file_type == "Q8_0"  # general.file_type MOSTLY_Q8_0, as llama.cpp names it
    assert m.files[0]["name"] == "Tiny-Llama.Q8.gguf" and m.size == src.stat().st_size
    assert m.source == {"kind": "import", "path": str(src.resolve())}
    gf = load_gguf(src)
    assert m.parameters == sum(math.prod(t.shape) for t in gf.tensors.values())
    assert sum(m.tensor_types.values()) == len(gf.tensors)
    assert [e.name for e in store.list()] == ["tiny-llama.q8:latest"]
    assert store.get("Tiny-Llama.Q8") == m
    path = store.resolve("tiny-llama.q8:latest")
    assert path.name == "Tiny-Llama.Q8.gguf" and path.read_bytes() == src.read_bytes()
    blob = store.blob_path(m.files[0]["sha256"])
    assert os.path.samefile(path, blob)
    store.remove("tiny-llama.q8")
    assert store.list() == [] and not blob.exists() and not path.exists()
    with pytest.raises(ModelNotFoundError, match="tiny-llama.q8:latest is not in the store"):
        store.resolve("tiny-llama.q8")
    with pytest.raises(ModelNotFoundError):
        store.remove("tiny-llama.q8")


def test_resolved_entry_loads_and_generates(store, tmp_path):
    from edged.loader import load

    store.import_path(write_tiny_model(tmp_path / "g.gguf", "gemma3"), name="tiny-gemma:v1")
    lm = load(str(store.resolve("tiny-gemma:v1")), warmup=False, quiet=True)
    assert lm.gguf.architecture == "gemma3" and lm.path.name == "g.gguf"


def test_split_model_keeps_its_part_names_and_loads(store, tmp_path, monkeypatch):
    from edged.loader import load

    parts = write_split_tiny_model(tmp_path / "split.gguf", "llama", 10, monkeypatch)
    assert len(parts) >= 2
    m = store.import_path(parts[1])  # any part brings the whole model
    assert m.name == "split:latest" and [f["name"] for f in m.files] == [p.name for p in parts]
    assert m.size == sum(p.stat().st_size for p in parts)
    first = store.resolve("split")
    assert first.name == parts[0].name
    lm = load(str(first), warmup=False, quiet=True)
    assert [p.name for p in lm.gguf.paths] == [p.name for p in parts]
    assert len(lm.gguf.tensors) == len(load_gguf(parts[0]).tensors)


def test_missing_links_are_rebuilt(store, tmp_path):
    store.import_path(write_tiny_model(tmp_path / "a.gguf", "qwen2"), name="a")
    link = store.resolve("a")
    link.unlink()
    assert store.resolve("a") == link and load_gguf(link).architecture == "qwen2"


def test_invalid_gguf_import_writes_nothing(store, tmp_path):
    bad = tmp_path / "broken.gguf"
    good = write_tiny_model(tmp_path / "good.gguf", "llama")
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # truncated: tensors past the end
    with pytest.raises(StoreError) as ei:
        store.import_path(bad)
    assert str(bad) in str(ei.value) and "not a valid GGUF" in str(ei.value)
    assert store.list() == [] and not (store.root / "blobs").exists() and not (store.root / "manifests").exists()
    with pytest.raises(StoreError, match="does not exist"):
        store.import_path(tmp_path / "nope.gguf")
    with pytest.raises(StoreError, match="not a model name"):
        store.import_path(good, name="bad/name")


def test_incomplete_and_malformed_entries_are_hidden(store, tmp_path):
    store.import_path(write_tiny_model(tmp_path / "a.gguf", "llama"), name="a")
    store.import_path(write_tiny_model(tmp_path / "b.gguf", "qwen2"), name="b")
    store.import_path(write_tiny_model(tmp_path / "c.gguf", "phi3"), name="c")
    blob_a = store.blob_path(store.get("a").files[0]["sha256"])
    with open(blob_a, "r+b") as f:  # a truncated blob
        f.truncate(100)
    (store.root / "manifests" / "b" / "latest.json").write_text("{ not json")
    wrong = json.loads((store.root / "manifests" / "c" / "latest.json").read_text())
    (store.root / "manifests" / "c" / "other.json").write_text(json.dumps(wrong))  # names c:latest
    assert [m.name for m in store.list()] == ["c:latest"]
    with pytest.raises(ModelNotFoundError, match="a:latest is incomplete") as ei:
        store.resolve("a")
    assert "available: c:latest" in str(ei.value)
    with pytest.raises(ModelNotFoundError, match="b:latest is not in the store"):
        store.get("b")
    store.remove("a")  # an incomplete entry can still be removed
    assert not (store.root / "manifests" / "a").exists()


def test_shared_blobs_stay_until_the_last_user_goes(store, tmp_path):
    src = write_tiny_model(tmp_path / "m.gguf", "llama")
    store.import_path(src, name="one")
    store.import_path(src, name="two:tagged")
    blob = store.blob_path(store.get("one").files[0]["sha256"])
    assert len(list((store.root / "blobs").iterdir())) == 1
    store.remove("one")
    assert blob.exists() and store.resolve("two:tagged").exists()
    store.remove("two:tagged")
    assert not blob.exists()


def test_reimport_replaces_and_drops_the_old_blob(store, tmp_path):
    store.import_path(write_tiny_model(tmp_path / "m.gguf", "llama", seed=1), name="m")
    old = store.blob_path(store.get("m").files[0]["sha256"])
    store.import_path(write_tiny_model(tmp_path / "m.gguf", "llama", seed=2), name="m")
    new = store.blob_path(store.get("m").files[0]["sha256"])
    assert new != old and new.exists() and not old.exists()
    assert os.path.samefile(store.resolve("m"), new)


def test_dead_writers_leftovers_go_live_ones_stay(store, tmp_path):
    store.import_path(write_tiny_model(tmp_path / "a.gguf", "llama"), name="a")
    tmp = store.root / "tmp"
    (tmp / "blob-dead.partial").write_bytes(b"x" * 10)  # nobody holds its lock
    (tmp / "pull-dead").mkdir()
    (tmp / "pull-dead" / "w.whl").write_bytes(b"x")
    (tmp / "pull-dead.lock").write_bytes(b"")
    path, live = store.temp.new_file("blob-")  # this process holds its lock
    with store.temp.new_dir("pull-") as live_dir:
        assert store.temp.clean() == 2
        assert path.exists() and live_dir.is_dir()
        assert sorted(p.name for p in tmp.iterdir()) == sorted([path.name, live_dir.name, live_dir.name + ".lock"])
    live.close()
    assert store.temp.clean() == 1 and list(tmp.iterdir()) == []
    assert [m.name for m in store.list()] == ["a:latest"]


def test_concurrent_imports_of_one_name_leave_one_consistent_entry(store, tmp_path):
    paths = [write_tiny_model(tmp_path / f"m{i}.gguf", "llama", seed=i) for i in range(3)]
    code = ("import sys; from edged.store import ModelStore; "
            "ModelStore(sys.argv[1]).import_path(sys.argv[2], name='same')")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(store.root), str(p)]) for p in paths * 2]
    assert [p.wait(timeout=300) for p in procs] == [0] * len(procs)
    m = store.get("same")
    assert m.files[0]["sha256"] in {hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert [b.name for b in (store.root / "blobs").iterdir()] == [f"sha256-{m.files[0]['sha256']}"]
    assert load_gguf(store.resolve("same")).architecture == "llama"
    assert list((store.root / "tmp").iterdir()) == []


def test_default_chat_model(store, tmp_path):
    assert store.default_chat_model() is None
    store.import_path(write_tiny_model(tmp_path / "m.gguf", "llama"), name="smollm2-135m-instruct")
    assert store.default_chat_model() == "smollm2-135m-instruct:latest"
