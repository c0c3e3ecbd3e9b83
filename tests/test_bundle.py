"""The offline kit: its layout and kit.json (fast, no pip), its checks on the way in, the model
import, `edged bundle` errors, and (slow) a real kit installed by ./install.sh --offline with no
package index, whose venv then serves the bundled model."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from edged.bundle import BundleError, import_models, models_for_kit, python_tag, read_kit, write_kit
from edged.cli import main
from edged.store import ModelStore
from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import free_port

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path):
    s = ModelStore(tmp_path / "store")
    s.import_path(write_tiny_model(tmp_path / "tiny.gguf", "llama"), name="tiny-chat")
    return s


def _fake_wheels(tmp_path) -> list[Path]:
    d = tmp_path / "wheels"
    d.mkdir()
    out = []
    for name, data in [("edged-0.1.0-py3-none-any.whl", b"edged"), ("numpy-2.0-cp311-cp311-x.whl", b"np")]:
        (d / name).write_bytes(data)
        out.append(d / name)
    return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_kit_layout_and_manifest(tmp_path, store):
    kit_path = tmp_path / "kit.tar"
    kit = write_kit(kit_path, _fake_wheels(tmp_path), models_for_kit(store, ["tiny-chat"]), extras=("cuda",))
    m = store.get("tiny-chat")
    blob = store.blob_path(m.files[0]["sha256"]).read_bytes()
    with tarfile.open(kit_path) as tar:
        names = tar.getnames()
        read = lambda n: tar.extractfile(f"edged-kit/{n}").read()  # noqa: E731
        assert json.loads(read("kit.json")) == kit
        sums = read("SHA256SUMS").decode()
        stored_manifest = json.loads(read("models/tiny-chat@latest/manifest.json"))
        assert read("models/tiny-chat@latest/tiny.gguf") == blob
    assert sorted(names) == sorted(f"edged-kit/{n}" for n in [
        "kit.json", "SHA256SUMS", "wheels/edged-0.1.0-py3-none-any.whl", "wheels/numpy-2.0-cp311-cp311-x.whl",
        "models/tiny-chat@latest/manifest.json", "models/tiny-chat@latest/tiny.gguf"])
    assert kit["format"] == 1 and kit["requirement"] == "edged[cuda]" and kit["extras"] == ["cuda"]
    assert kit["python_tag"] == python_tag() == f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert kit["platform"] == sysconfig.get_platform()
    assert kit["wheels"] == ["edged-0.1.0-py3-none-any.whl", "numpy-2.0-cp311-cp311-x.whl"]
    assert kit["models"] == [{"name": "tiny-chat:latest", "dir": "models/tiny-chat@latest", "files": ["tiny.gguf"]}]
    assert kit["members"]["wheels/numpy-2.0-cp311-cp311-x.whl"] == _sha(b"np")
    assert kit["members"]["models/tiny-chat@latest/tiny.gguf"] == m.files[0]["sha256"] == _sha(blob)
    assert stored_manifest["name"] == "tiny-chat:latest" and stored_manifest["files"] == [dict(f) for f in m.files]
    # SHA256SUMS is kit.json's members in `sha256sum -c` form (install.sh checks it before pip runs)
    assert sums == "".join(f"{d}  {n}\n" for n, d in sorted(kit["members"].items()))


def _extracted(tmp_path, store) -> Path:
    kit_path = tmp_path / "kit.tar"
    write_kit(kit_path, _fake_wheels(tmp_path), models_for_kit(store, ["tiny-chat"]))
    with tarfile.open(kit_path) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    return tmp_path / "x" / "edged-kit"


def test_import_models_keeps_name_and_source_and_is_idempotent(tmp_path, store):
    kit_dir = _extracted(tmp_path, store)
    target = ModelStore(tmp_path / "target")
    notes = []
    assert import_models(kit_dir, target, log=notes.append) == ["tiny-chat:latest"]
    got, orig = target.get("tiny-chat"), store.get("tiny-chat")
    assert got.files == orig.files
    assert got.source["kind"] == orig.source["kind"] == "import" and got.source["path"] == orig.source["path"]
    assert got.source["kit"] == read_kit(kit_dir)["created"]
    assert target.resolve("tiny-chat").read_bytes() == store.resolve("tiny-chat").read_bytes()
    assert import_models(kit_dir, target, log=notes.append) == ["tiny-chat:latest"]
    assert notes == ["imported tiny-chat:latest", "tiny-chat:latest is up to date"]


def test_damaged_or_foreign_kits_are_refused(tmp_path, store):
    kit_dir = _extracted(tmp_path, store)
    gguf = kit_dir / "models/tiny-chat@latest/tiny.gguf"
    data = bytearray(gguf.read_bytes())
    data[-1] ^= 1
    gguf.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="kit member models/tiny-chat@latest/tiny.gguf is damaged"):
        import_models(kit_dir, ModelStore(tmp_path / "t1"))
    gguf.unlink()
    with pytest.raises(BundleError, match="tiny.gguf is missing"):
        read_kit(kit_dir)
    kit = json.loads((kit_dir / "kit.json").read_text())
    (kit_dir / "kit.json").write_text(json.dumps({**kit, "members": {"../../etc/passwd": "0" * 64}}))
    with pytest.raises(BundleError, match="points outside the kit"):
        read_kit(kit_dir)
    (kit_dir / "kit.json").write_text(json.dumps({**kit, "format": 99}))
    with pytest.raises(BundleError, match="format 99"):
        read_kit(kit_dir)
    with pytest.raises(BundleError, match="not an extracted edged kit"):
        read_kit(tmp_path)


def test_a_damaged_store_blob_is_not_packed(tmp_path, store):
    m = store.get("tiny-chat")
    blob = store.blob_path(m.files[0]["sha256"])
    data = bytearray(blob.read_bytes())
    data[100] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="pull or import it again"):
        write_kit(tmp_path / "kit.tar", _fake_wheels(tmp_path), models_for_kit(store, ["tiny-chat"]))


def test_bundle_command_errors(tmp_path, store, monkeypatch):
    monkeypatch.setenv("EDGED_MODELS", str(store.root))
    r = CliRunner().invoke(main, ["bundle", str(tmp_path / "kit.tar"), "--model", "nope"])
    assert r.exit_code == 1 and "nope:latest is not in the store" in r.output and "tiny-chat:latest" in r.output
    r = CliRunner().invoke(main, ["bundle", str(tmp_path / "kit.tar")])  # the default chat model is absent
    assert r.exit_code == 1 and "smollm2-135m-instruct:latest is not in the store" in r.output
    r = CliRunner().invoke(main, ["bundle", str(tmp_path / "kit.tar.gz"), "--model", "tiny-chat"])
    assert r.exit_code == 2 and "uncompressed .tar" in r.output
    # pip failing (no index, nothing to find): its error, and no kit left behind
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    r = CliRunner().invoke(main, ["bundle", str(tmp_path / "kit.tar"), "--model", "tiny-chat"])
    assert r.exit_code == 1 and "pip wheel edged failed" in r.output and "PIP_NO_INDEX" in r.output
    assert not list(tmp_path.glob("kit.tar*"))


@pytest.mark.slow
@pytest.mark.e2e
def test_offline_kit_installs_without_an_index_and_serves(tmp_path, store):
    """`edged bundle` (pip fetches ~100 MB of wheels, or finds them in its cache), then
    ./install.sh --offline into a fresh directory with PIP_NO_INDEX=1, then that venv's `edged serve`
    (no MODEL: the store the kit filled) answers a completion with the bundled model."""
    env = {**os.environ, "EDGED_MODELS": str(store.root)}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", "from edged.cli import main; main()", "bundle",
                        str(tmp_path / "kit.tar"), "--model", "tiny-chat"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    t_bundle = time.monotonic() - t0

    target = tmp_path / "machine"
    target.mkdir()
    shutil.copy(REPO / "install.sh", target / "install.sh")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    offline = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty),
               "EDGED_MODELS": str(tmp_path / "target-store"), "EDGED_CACHE_DIR": str(tmp_path / "cache")}
    offline.pop("PIP_INDEX_URL", None)
    r = subprocess.run([str(target / "install.sh"), "--offline", str(tmp_path / "kit.tar")], env=offline,
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    venv = target / ".venv"
    assert "imported tiny-chat:latest" in r.stderr
    t_install = time.monotonic() - t0 - t_bundle

    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([str(venv / "bin" / "edged"), "serve", "--port", str(port)], env=offline,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 1500  # a new venv compiles every kernel the model needs
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "edged serve from the kit never became ready"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        # the installed edged is the kit's wheel, not this checkout
        where = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", "import edged; print(edged.__file__)"],
                               capture_output=True, text=True).stdout
        assert str(venv) in where
        reply = httpx.post(f"{url}/v1/completions", json={"model": "tiny-chat", "prompt": "hello",
                                                          "max_tokens": 4, "temperature": 0}, timeout=600)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    print(f"bundle {t_bundle:.0f} s, install {t_install:.0f} s, serve ready and answered "
          f"{time.monotonic() - t0 - t_bundle - t_install:.0f} s")
