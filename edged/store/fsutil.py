"""Crash-safe file primitives of the store: locks, temp files that a later writer can tell are
abandoned, fsync'd renames. Linux/POSIX (fcntl.flock); a lock dies with its process, even on kill -9."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Makes a rename or unlink in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: Path, shared: bool = False, on_wait=None):
    """flock on `path` (created if absent); on_wait() is called once if the lock is held elsewhere."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive lock on `path`, or None when a live process holds it."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


class TempArea:
    """<root>/tmp: every temp file is flock'ed by its writer for as long as it lives, so `clean`
    removes exactly the ones whose writer died. `guard` is the store-wide lock: creation takes it
    shared (create + lock is then atomic to a cleaner), `clean` takes it exclusive."""

    def __init__(self, root: Path, guard: Path):
        self.root = root
        self.guard = guard

    def new_file(self, prefix: str) -> tuple[Path, object]:
        """(path, open binary file) of a new locked temp file; the lock lasts until the file closes."""
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.guard, shared=True):
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=".partial", dir=self.root)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return Path(name), os.fdopen(fd, "wb")

    @contextlib.contextmanager
    def new_dir(self, prefix: str):
        """A temp directory for the duration of the block (its lock is the sibling `<dir>.lock`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.guard, shared=True):
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=".lock", dir=self.root)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            d = Path(name[: -len(".lock")])
            d.mkdir()
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
            os.unlink(name)
            os.close(fd)

    def clean(self) -> int:
        """Removes what dead writers left (temp files, download dirs); returns how many entries."""
        if not self.root.is_dir():
            return 0
        removed = 0
        with file_lock(self.guard):
            entries = {p.name: p for p in self.root.iterdir()}
            for name, p in entries.items():
                if name.endswith(".partial") or name.endswith(".lock"):
                    fd = _try_lock(p)
                    if fd is None:
                        continue  # a live writer
                    try:
                        if name.endswith(".lock"):
                            shutil.rmtree(p.with_name(name[: -len(".lock")]), ignore_errors=True)
                        p.unlink(missing_ok=True)
                        removed += 1
                    finally:
                        os.close(fd)
                elif p.is_dir() and f"{name}.lock" not in entries:
                    shutil.rmtree(p, ignore_errors=True)  # its lock went first: abandoned mid-removal
                    removed += 1
        return removed


def write_durably(f, path: Path, target: Path) -> None:
    """Flushes and fsyncs the open temp file `f` at `path`, then renames it onto `target`."""
    f.flush()
    os.fsync(f.fileno())
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, target)
    fsync_dir(target.parent)
    f.close()
