"""The model store: blobs by sha256, one manifest per name:tag, links with the original file names.

    <root>/blobs/sha256-<hex>                  the bytes of one GGUF file (one part of a split model)
    <root>/manifests/<name>/<tag>.json         the entry (Manifest); written last, so it marks completeness
    <root>/files/<name>/<tag>/<file name>...   hard links to the blobs under the original names: a
                                               split model's parts are found by their names
    <root>/tmp/, <root>/locks/, <root>/.lock   temp files, per-name writer locks, the store-wide lock
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from edged.store.blobs import BlobWriter, blob_name, byte_counter, link_or_symlink
from edged.store.errors import ModelNotFoundError, StoreError
from edged.store.fsutil import TempArea, file_lock, fsync_dir, write_durably
from edged.store.gguf_facts import validated_facts
from edged.store.manifest import Manifest
from edged.store.names import full_name, split_name

DEFAULT_CHAT_MODEL = "smollm2-135m-instruct:latest"


def default_store_root() -> Path:
    """$EDGED_MODELS, else $XDG_DATA_HOME/edged/models, else ~/.local/share/edged/models."""
    if os.environ.get("EDGED_MODELS"):
        return Path(os.environ["EDGED_MODELS"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "edged" / "models"


class ModelStore:
    """A store directory (created on first write). Readers take no locks; writers of one name
    serialise on locks/<name>@<tag>.lock, and each commit or removal holds the store-wide lock."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root).expanduser() if root is not None else default_store_root()
        self.blobs = self.root / "blobs"
        self.manifests = self.root / "manifests"
        self.files = self.root / "files"
        self.temp = TempArea(self.root / "tmp", self.root / ".lock")

    # ---- reading ---------------------------------------------------------------------------

    def list(self) -> list[Manifest]:
        """Complete entries only (manifest parses, every blob present with its size), by name."""
        out = []
        if not self.manifests.is_dir():
            return out
        for d in self.manifests.iterdir():
            for p in d.glob("*.json") if d.is_dir() else ():
                m = self._read(d.name, p.stem)
                if m is not None and self._complete(m):
                    out.append(m)
        return sorted(out, key=lambda m: m.name)

    def get(self, name: str) -> Manifest:
        """The complete entry `name` (":latest" when no tag); ModelNotFoundError naming what is there."""
        model, tag = split_name(name)
        m = self._read(model, tag)
        if m is not None and self._complete(m):
            return m
        have = ", ".join(e.name for e in self.list()) or "none"
        state = "is incomplete (a blob is missing or truncated)" if m is not None else "is not in the store"
        raise ModelNotFoundError(f"model {model}:{tag} {state} ({self.root}); available: {have}. "
                                 f"Get it with `edged pull {model}:{tag}` or `edged models import PATH`")

    def has(self, name: str) -> bool:
        try:
            self.get(name)
            return True
        except StoreError:
            return False

    def resolve(self, name: str) -> Path:
        """A path edged.loader.load / quant.load_gguf open: the entry's first file under its own name."""
        m = self.get(name)
        return self._ensure_links(m) / m.files[0]["name"]

    def default_chat_model(self) -> str | None:
        """The default chat model's name when the store holds it, else None."""
        return DEFAULT_CHAT_MODEL if self.has(DEFAULT_CHAT_MODEL) else None

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / blob_name(sha256)

    # ---- writing ---------------------------------------------------------------------------

    def import_path(self, path, name: str | None = None, source: dict | None = None,
                    progress=None) -> Manifest:
        """Validates the GGUF at `path` (every part of a split model), copies it into the store
        and writes the manifest last. name defaults to the file stem, lower-cased, tag "latest".
        progress(done_bytes, total_bytes) after each chunk copied, if given."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise StoreError(f"{path} does not exist or is not a file")
        full = full_name(name if name is not None else _name_from_file(path))
        facts = validated_facts(path)  # before anything is written
        parts = facts["parts"]
        source = source or {"kind": "import", "path": str(path.resolve())}
        advance = byte_counter(sum(p.stat().st_size for p in parts), progress)

        with self.writer_lock(full):
            self.temp.clean()
            files = []
            for p in parts:
                with BlobWriter(self.temp, self.blobs) as w, open(p, "rb") as f:
                    w.copy_from(f, advance)
                    sha, size = w.finish(what=str(p))
                files.append({"name": p.name, "sha256": sha, "size": size})
            return self.commit(full, files, source)

    def writer_lock(self, name: str, on_wait=None):
        """The lock every writer of `name` holds from its first byte to its manifest."""
        model, tag = split_name(name)
        return file_lock(self.root / "locks" / f"{model}@{tag}.lock", on_wait=on_wait)

    def commit(self, name: str, files: list[dict], source: dict, shown_as: str | None = None) -> Manifest:
        """Validates the stored blobs `files` as one GGUF model, installs their links and writes the
        manifest (last: an entry without it does not exist). Blobs the entry no longer uses go."""
        model, tag = split_name(name)
        with self.temp.new_dir("commit-") as work:
            staged = work / "links"
            staged.mkdir()
            for f in files:
                link_or_symlink(self.blob_path(f["sha256"]), staged / f["name"])
            facts = validated_facts(staged / files[0]["name"], shown_as=shown_as)
            if len(facts["parts"]) != len(files):
                raise StoreError(f"{name}: {len(files)} files given, the GGUF has {len(facts['parts'])} parts")
            m = Manifest(name=f"{model}:{tag}", files=tuple(files), size=sum(f["size"] for f in files),
                         architecture=facts["architecture"], parameters=facts["parameters"],
                         tensor_types=facts["tensor_types"], context_length=facts["context_length"],
                         chat_template=facts["chat_template"], file_type=facts["file_type"], source=dict(source),
                         created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            tmp_path, f = self.temp.new_file("manifest-")
            try:
                f.write(m.to_json().encode())
                with file_lock(self.root / ".lock"):
                    if not self._complete(m):  # a concurrent `rm` took a blob: keep nothing half-made
                        raise StoreError(f"{name}: a blob disappeared while it was being stored; try again")
                    old = self._read(model, tag)
                    self._install_links(staged, model, tag)
                    write_durably(f, tmp_path, self._manifest_path(model, tag))
                    if old is not None:
                        self._drop_unused_blobs([f["sha256"] for f in old.files])
            finally:
                f.close()
                tmp_path.unlink(missing_ok=True)  # renamed away on success
        return m

    def remove(self, name: str) -> None:
        """Removes the manifest (first: the entry is gone at once), its links, then the blobs no
        other manifest uses. ModelNotFoundError when there is no such entry."""
        model, tag = split_name(name)
        path = self._manifest_path(model, tag)
        with self.writer_lock(name), file_lock(self.root / ".lock"):
            if not path.is_file():
                self.get(name)  # raises, naming what is there
            m = self._read(model, tag)
            path.unlink()
            fsync_dir(path.parent)
            try:
                path.parent.rmdir()  # the name's last tag
            except OSError:
                pass
            shutil.rmtree(self.files / model / tag, ignore_errors=True)
            try:
                (self.files / model).rmdir()
            except OSError:
                pass
            if m is not None:
                self._drop_unused_blobs([f["sha256"] for f in m.files])

    # ---- internals -------------------------------------------------------------------------

    def _manifest_path(self, model: str, tag: str) -> Path:
        return self.manifests / model / f"{tag}.json"

    def _read(self, model: str, tag: str) -> Manifest | None:
        """The parsed manifest, or None when absent, malformed or not the entry its path says."""
        p = self._manifest_path(model, tag)
        try:
            m = Manifest.from_json(p.read_text(), where=str(p))
        except (OSError, UnicodeDecodeError, StoreError):
            return None
        return m if m.name == f"{model}:{tag}" else None

    def _complete(self, m: Manifest) -> bool:
        for f in m.files:
            try:
                if self.blob_path(f["sha256"]).stat().st_size != f["size"]:
                    return False
            except OSError:
                return False
        return True

    def _links_ok(self, d: Path, m: Manifest) -> bool:
        try:
            return all(os.path.samefile(d / f["name"], self.blob_path(f["sha256"])) for f in m.files)
        except OSError:
            return False

    def _ensure_links(self, m: Manifest) -> Path:
        """files/<name>/<tag>, rebuilt if it is missing or stale (the store needs to be writable then)."""
        model, tag = split_name(m.name)
        d = self.files / model / tag
        if self._links_ok(d, m):
            return d
        try:
            with self.temp.new_dir("links-") as work:
                staged = work / "links"
                staged.mkdir()
                for f in m.files:
                    link_or_symlink(self.blob_path(f["sha256"]), staged / f["name"])
                with file_lock(self.root / ".lock"):
                    self._install_links(staged, model, tag)
        except OSError as e:
            raise StoreError(f"cannot link {m.name}'s files under {d}: {e}") from None
        return d

    def _install_links(self, staged: Path, model: str, tag: str) -> None:
        """Swaps the staged link directory into files/<name>/<tag> (caller holds the store lock)."""
        d = self.files / model / tag
        d.parent.mkdir(parents=True, exist_ok=True)
        if d.exists():
            trash = staged.parent / "old-links"
            os.rename(d, trash)
        os.rename(staged, d)
        fsync_dir(d.parent)

    def drop_unreferenced(self, sha256s) -> None:
        """Deletes those blobs no manifest references (a failed pull's, say)."""
        with file_lock(self.root / ".lock"):
            self._drop_unused_blobs(sha256s)

    def _drop_unused_blobs(self, sha256s) -> None:
        """Deletes the blobs `sha256s` that no manifest on disk references (caller holds the store lock)."""
        used = set()
        for p in self.manifests.glob("*/*.json") if self.manifests.is_dir() else ():
            other = self._read(p.parent.name, p.stem)
            if other is not None:
                used.update(f["sha256"] for f in other.files)
        for sha in sha256s:
            if sha not in used:
                self.blob_path(sha).unlink(missing_ok=True)
        if self.blobs.is_dir():
            fsync_dir(self.blobs)


def _name_from_file(path: Path) -> str:
    """A store name from a file name: `SmolLM2-135M.Q4_1.gguf` -> `smollm2-135m.q4_1`, split
    parts without their `-0000k-of-0000n` suffix."""
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", path.stem)
    cleaned = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in stem.lower())
    cleaned = cleaned.strip("-._")
    if not cleaned:
        raise StoreError(f"cannot make a model name from {path.name!r}; pass --name")
    return cleaned[:128]
