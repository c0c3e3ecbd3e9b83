"""Numba settings edged's kernels depend on; applied once, before numba is imported."""

import os
import sys
from pathlib import Path


def cache_root() -> Path:
    """Base directory for edged's on-disk caches (EDGED_CACHE_DIR, else XDG cache)."""
    base = os.environ.get("EDGED_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "edged"


def _numba_version() -> str:
    try:
        from importlib.metadata import version

        return version("numba")
    except Exception:
        return "unknown"


# packages holding Numba kernels or the LLVM-IR helpers they inline (relative to edged)
_KERNEL_PACKAGES = ("", "tokenizer", "quant", "backends", "backends/cpu")


def _kernel_source_hash() -> str:
    """8 hex digits of SHA-256 over the sources of every kernel package.

    Numba's cache only checks the file that defines a kernel; a kernel that inlines helpers from
    another module (simd.py, kquant_simd.py) would otherwise load stale machine code after that
    module changes.
    """
    import hashlib
    import importlib.util

    h = hashlib.sha256()
    for sub in _KERNEL_PACKAGES:
        name = "edged" + ("." + sub.replace("/", ".") if sub else "")
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for d in (spec.submodule_search_locations or []) if spec else []:
            for f in sorted(Path(d).glob("*.py")):
                h.update(f.name.encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:8]


def configure_numba() -> None:
    """Turn on SLP vectorization (VNNI codegen), the omp threading layer and a versioned JIT cache.

    The on-disk cache does not key on NUMBA_SLP_VECTORIZE, edged's version nor the helper modules a
    kernel inlines, so the directory name carries all three: an upgrade or an edit never loads stale
    machine code. Directories of earlier sources of the same version are pruned after a day.
    """
    if "numba" in sys.modules:
        return  # too late to change codegen settings; keep whatever the host process chose
    from edged import __version__

    os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")
    os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")
    if "NUMBA_CACHE_DIR" not in os.environ:
        slp = os.environ["NUMBA_SLP_VECTORIZE"]
        tag = f"edged-{__version__}_numba-{_numba_version()}_slp{slp}_src"
        root = cache_root() / "numba"
        os.environ["NUMBA_CACHE_DIR"] = str(root / (tag + _kernel_source_hash()))
        _prune(root, tag, keep=Path(os.environ["NUMBA_CACHE_DIR"]).name)


def _prune(root: Path, prefix: str, keep: str, max_age_s: float = 86400.0) -> None:
    """Remove cache dirs of other kernel sources of this version untouched for max_age_s."""
    import shutil
    import time

    try:
        for d in root.glob(prefix + "*"):
            if d.name != keep and time.time() - d.stat().st_mtime > max_age_s:
                shutil.rmtree(d, ignore_errors=True)
    except OSError:
        pass
