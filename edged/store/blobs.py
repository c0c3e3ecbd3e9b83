"""Writing one blob: streamed into a locked temp file while hashed, fsync'd, renamed to
blobs/sha256-<hex> only when complete (and, when expected, with the right digest and size)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from edged.store.errors import StoreError
from edged.store.fsutil import TempArea, write_durably

CHUNK = 4 << 20


def blob_name(sha256: str) -> str:
    return f"sha256-{sha256}"



def byte_counter(total: int, progress):
    """advance(n) for BlobWriter.copy_from: reports progress(bytes so far, total) when progress is given."""
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    return advance


class BlobWriter:
    """`with BlobWriter(tmp, blobs) as w: w.write(b); sha, size = w.finish(expected...)`; an
    exception (or no finish) inside the block discards the temp file."""

    def __init__(self, temp: TempArea, blobs_dir: Path):
        self.blobs_dir = blobs_dir
        self.path, self._f = temp.new_file("blob-")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._f.write(data)
        self._hash.update(data)
        self.size += len(data)

    def copy_from(self, f, on_chunk=None) -> None:
        """Streams the readable binary file `f` in; on_chunk(n_bytes) after each chunk."""
        while chunk := f.read(CHUNK):
            self.write(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))

    def finish(self, expected_sha256: str | None = None, expected_size: int | None = None,
               what: str = "blob") -> tuple[str, int]:
        """(sha256 hex, size) of the now-stored blob; StoreError (nothing stored) on a mismatch."""
        sha = self._hash.hexdigest()
        if expected_size is not None and self.size != expected_size:
            raise StoreError(f"{what}: {self.size:,} bytes, expected {expected_size:,}; nothing stored")
        if expected_sha256 is not None and sha != expected_sha256:
            raise StoreError(f"{what}: sha256 {sha}, expected {expected_sha256}; nothing stored")
        target = self.blobs_dir / blob_name(sha)
        if target.is_file() and target.stat().st_size == self.size:
            self._discard()  # the same bytes are stored already (and may be linked from files/)
        else:
            write_durably(self._f, self.path, target)
        return sha, self.size

    def _discard(self) -> None:
        if not self._f.closed:
            self._f.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> "BlobWriter":
        return self

    def __exit__(self, *exc) -> None:
        if not self._f.closed:  # finish() not reached, or raised: nothing stays behind
            self._discard()


def hash_file(path: Path) -> tuple[str, int]:
    """(sha256 hex, size) of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def link_or_symlink(src: Path, dst: Path) -> None:
    """A hard link (survives the blob's removal while open elsewhere); a symlink where the file
    system has no hard links."""
    try:
        os.link(src, dst)
    except OSError:
        os.symlink(src.resolve(), dst)
