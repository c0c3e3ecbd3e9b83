"""The offline kit: one tar with edged's wheel, the wheels of its dependency closure for this
platform and Python, and models of the store with their manifests, so that `./install.sh --offline
KIT.tar` installs everything on a machine with no package index.

    edged-kit/kit.json                           what is inside: versions, Python tag, platform, models
    edged-kit/SHA256SUMS                         sha256 of every other member (`sha256sum -c` format)
    edged-kit/wheels/*.whl                       edged and every dependency (wheels only: no builds offline)
    edged-kit/models/<name>@<tag>/manifest.json  the store manifest
    edged-kit/models/<name>@<tag>/<file>...      its GGUF file(s) under their original names

Building: build_kit (`edged bundle`). Installing the models: `python -m edged.bundle import-models DIR`
(install.sh runs it with the new venv's python after pip has installed the wheels).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

KIT_FORMAT = 1
TOP = "edged-kit"
_PIP_TAIL_LINES = 15
# what a checkout holds besides edged's source (what .gitignore lists, and git's own directory)
_NOT_SOURCE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache",
               ".peer-venv", "results", ".whl")


class BundleError(Exception):
    """Building or reading a kit failed; the message names the model, file or pip step."""


@dataclass(frozen=True)
class KitModel:
    manifest: object  # edged.store.Manifest
    blobs: tuple  # Path of each file's blob, in split order

    @property
    def dir(self) -> str:
        return "models/" + self.manifest.name.replace(":", "@")


def python_tag() -> str:
    """cp311 and the like: the wheels of a kit fit this interpreter only."""
    impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    return f"{impl}{sys.version_info.major}{sys.version_info.minor}"


def kit_manifest(wheels: list[str], models: list[KitModel], members: dict[str, str], extras: tuple) -> dict:
    """kit.json: enough to check a kit fits a machine before installing, and to import its models."""
    from importlib.metadata import version

    return {
        "format": KIT_FORMAT,
        "edged_version": version("edged"),
        "requirement": _requirement(extras),
        "extras": list(extras),
        "python": platform.python_version(),
        "python_tag": python_tag(),
        "platform": sysconfig.get_platform(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wheels": sorted(wheels),
        "models": [{"name": m.manifest.name, "dir": m.dir,
                    "files": [f["name"] for f in m.manifest.files]} for m in models],
        "members": dict(sorted(members.items())),
    }


def _requirement(extras: tuple) -> str:
    return f"edged[{','.join(extras)}]" if extras else "edged"


# ---- building -------------------------------------------------------------------------------

def models_for_kit(store, names: list[str]) -> list[KitModel]:
    """The store entries to pack; BundleError naming what the store holds when one is absent."""
    from edged.store import StoreError

    out = []
    for name in names:
        try:
            m = store.get(name)
        except StoreError as e:
            raise BundleError(str(e)) from None
        out.append(KitModel(m, tuple(store.blob_path(f["sha256"]) for f in m.files)))
    return out


def build_kit(out: Path, models: list[KitModel], extras: tuple = (), source: Path | None = None,
              log=lambda s: None) -> dict:
    """Write the kit to `out` (atomically: a partial file is never left under that name); returns
    its kit.json. pip (this interpreter's) builds edged's wheel and downloads the dependencies,
    honouring PIP_INDEX_URL / PIP_FIND_LINKS / PIP_NO_INDEX and pip's configuration."""
    source = source or source_tree()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edged-bundle-") as tmp:
        wheels = Path(tmp) / "wheels"
        log(f"building edged's wheel from {source}")
        # from a clean copy: setuptools would package whatever a stale build/ left in the checkout
        clean = Path(tmp) / "src"
        shutil.copytree(source, clean, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
        own = _pip(["wheel", "--no-deps", "--wheel-dir", str(wheels), str(clean)], "pip wheel edged")
        edged_wheel = _only_new_wheel(wheels, own)
        log(f"downloading the wheels of {_requirement(extras)} for {python_tag()} on {sysconfig.get_platform()}")
        _pip(["download", "--only-binary=:all:", "--dest", str(wheels), f"{edged_wheel}{_extras_suffix(extras)}"],
             f"pip download {_requirement(extras)}")
        partial = out.with_name(out.name + ".partial")
        try:
            kit = write_kit(partial, sorted(wheels.glob("*.whl")), models, extras, log)
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
    return kit


def source_tree() -> Path:
    """The source checkout edged runs from (./install.sh installs it editable); its wheel is built
    from there. BundleError when edged was installed from a wheel instead."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or 'name = "edged"' not in pyproject.read_text():
        raise BundleError(f"edged bundle builds edged's wheel from its source tree, and this edged ({root}) "
                          "is not installed from one; run it from a checkout installed with ./install.sh")
    return root


def _extras_suffix(extras: tuple) -> str:
    return f"[{','.join(extras)}]" if extras else ""


def _pip(args: list[str], what: str) -> str:
    """Run this interpreter's pip quietly; BundleError with pip's last lines when it fails."""
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    output = r.stdout + r.stderr
    if r.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-_PIP_TAIL_LINES:])
        raise BundleError(f"{what} failed (exit {r.returncode}; the index is PIP_INDEX_URL / PIP_FIND_LINKS "
                          f"or pip's configuration, PIP_NO_INDEX=1 turns it off); pip's last lines:\n{tail}")
    return output


def _only_new_wheel(wheels: Path, pip_output: str) -> Path:
    found = [p for p in wheels.glob("edged-*.whl")]
    if len(found) != 1:
        raise BundleError(f"pip wheel reported success but left {len(found)} edged wheels in {wheels}:\n{pip_output}")
    return found[0]


def write_kit(path: Path, wheels: list[Path], models: list[KitModel], extras: tuple = (),
              log=lambda s: None) -> dict:
    """The tar itself, from wheel files already made; returns its kit.json."""
    members: dict[str, str] = {}
    with tarfile.open(path, "w") as tar:  # uncompressed: wheels and GGUF weights barely compress
        for w in wheels:
            name = f"wheels/{w.name}"
            members[name] = _add_file(tar, w, name)
        for m in models:
            log(f"adding {m.manifest.name} ({sum(f['size'] for f in m.manifest.files):,} bytes)")
            members[f"{m.dir}/manifest.json"] = _add_bytes(tar, f"{m.dir}/manifest.json",
                                                           m.manifest.to_json().encode())
            for f, blob in zip(m.manifest.files, m.blobs):
                name = f"{m.dir}/{f['name']}"
                members[name] = _add_file(tar, blob, name)
                if members[name] != f["sha256"]:  # a damaged blob must not travel as a good one
                    raise BundleError(f"{m.manifest.name}: the store's blob of {f['name']} ({blob}) has sha256 "
                                      f"{members[name]}, its manifest says {f['sha256']}; pull or import it again")
        kit = kit_manifest([w.name for w in wheels], models, members, extras)
        sums = "".join(f"{digest}  {name}\n" for name, digest in sorted(members.items()))
        _add_bytes(tar, "SHA256SUMS", sums.encode())
        _add_bytes(tar, "kit.json", (json.dumps(kit, indent=2) + "\n").encode())
    return kit


def _add_file(tar: tarfile.TarFile, src: Path, name: str) -> str:
    """Add src as TOP/name, hashing it on the way; returns its sha256."""
    digest = hashlib.sha256()

    class Hashing(io.RawIOBase):  # tar reads the file once: hash what it reads
        def __init__(self, f):
            self.f = f

        def readinto(self, b):
            n = self.f.readinto(b)
            digest.update(memoryview(b)[:n])
            return n

        def readable(self):
            return True

    info = tarfile.TarInfo(f"{TOP}/{name}")
    info.size = src.stat().st_size
    info.mtime = int(time.time())
    info.mode = 0o644
    with open(src, "rb") as f:
        tar.addfile(info, io.BufferedReader(Hashing(f), 1 << 20))
    return digest.hexdigest()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> str:
    info = tarfile.TarInfo(f"{TOP}/{name}")
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(data).hexdigest()


# ---- installing -----------------------------------------------------------------------------

def read_kit(kit_dir: Path) -> dict:
    """kit.json of an extracted kit, with every member's sha256 checked; BundleError naming the member."""
    from edged.store.blobs import hash_file

    kit_dir = Path(kit_dir)
    try:
        kit = json.loads((kit_dir / "kit.json").read_text())
    except (OSError, ValueError) as e:
        raise BundleError(f"{kit_dir} is not an extracted edged kit (kit.json: {e})") from None
    if kit.get("format") != KIT_FORMAT:
        raise BundleError(f"{kit_dir}/kit.json: format {kit.get('format')!r}, this edged reads format {KIT_FORMAT}")
    for name in [*kit["members"], *(m["dir"] for m in kit["models"])]:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise BundleError(f"{kit_dir}/kit.json: member {name!r} points outside the kit")
    for name, digest in kit["members"].items():
        try:
            got, _ = hash_file(kit_dir / name)
        except OSError as e:
            raise BundleError(f"kit member {name} is missing or unreadable ({e})") from None
        if got != digest:
            raise BundleError(f"kit member {name} is damaged: sha256 {got}, kit.json says {digest}")
    return kit


def import_models(kit_dir: Path, store=None, log=lambda s: None) -> list[str]:
    """Put the kit's models in the store under their manifest names, keeping their source (a kit
    model pulled from the index still says so); a model already stored with the same files is
    left as it is. Returns the names."""
    from edged.store import Manifest, ModelStore, StoreError

    kit_dir = Path(kit_dir)
    kit = read_kit(kit_dir)
    store = store or ModelStore()
    names = []
    for entry in kit["models"]:
        d = kit_dir / entry["dir"]
        try:
            m = Manifest.from_json((d / "manifest.json").read_text(), where=str(d / "manifest.json"))
            if store.has(m.name) and [f["sha256"] for f in store.get(m.name).files] == [f["sha256"] for f in m.files]:
                log(f"{m.name} is up to date")
            else:
                got = store.import_path(d / m.files[0]["name"], name=m.name,
                                        source={**m.source, "kit": kit["created"]})
                if [f["sha256"] for f in got.files] != [f["sha256"] for f in m.files]:
                    raise BundleError(f"{m.name}: the imported files differ from the kit's manifest")
                log(f"imported {m.name}")
        except StoreError as e:
            raise BundleError(f"importing {entry['name']} from the kit: {e}") from None
        names.append(m.name)
    return names


def main(argv: list[str]) -> int:
    """`python -m edged.bundle import-models DIR`: what install.sh --offline runs after pip."""
    if len(argv) != 2 or argv[0] != "import-models":
        print("usage: python -m edged.bundle import-models KIT_DIR", file=sys.stderr)
        return 2
    try:
        import_models(Path(argv[1]), log=lambda s: print(s, file=sys.stderr))
    except BundleError as e:
        print(f"edged: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
