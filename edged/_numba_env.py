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


def configure_numba() -> None:
    """Turn on SLP vectorization (VNNI codegen), the omp threading layer and a versioned JIT cache.

    The on-disk cache does not key on NUMBA_SLP_VECTORIZE nor on edged's version, so the directory
    name carries both: an upgrade never loads stale machine code.
    """
    if "numba" in sys.modules:
        return  # too late to change codegen settings; keep whatever the host process chose
    from edged import __version__

    os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")
    os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")
    if "NUMBA_CACHE_DIR" not in os.environ:
        slp = os.environ["NUMBA_SLP_VECTORIZE"]
        tag = f"edged-{__version__}_numba-{_numba_version()}_slp{slp}"
        os.environ["NUMBA_CACHE_DIR"] = str(cache_root() / "numba" / tag)
