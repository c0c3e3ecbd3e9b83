"""Numba settings edged's kernels depend on; applied once, before numba is imported."""

import os
import re
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


# edged's packages and their folders in a checkout (pyproject's package-dir); installed, all under edged/
_PACKAGE_DIRS = {"edged": "edged", "edged.quant": "quant", "edged.backends": "backends", "edged.models": "models"}
_KERNEL_LIBS = ("numba", "llvmlite")


def _package_dirs(root: Path | None) -> dict[str, Path]:
    """Each package's folder: under `root` laid out as a checkout, else where Python finds it."""
    if root is not None:
        return {pkg: Path(root) / d for pkg, d in _PACKAGE_DIRS.items()}
    import importlib.util

    dirs = {}
    for pkg in _PACKAGE_DIRS:
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        for d in (spec.submodule_search_locations or []) if spec else []:
            dirs[pkg] = Path(d)
    return dirs


def _modules(dirs: dict[str, Path]) -> dict[str, Path]:
    """Module name -> source file of every module in the packages."""
    mods = {}
    for pkg, d in dirs.items():
        for f in sorted(d.rglob("*.py")):
            parts = f.relative_to(d).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join((pkg, *parts))] = f
    return mods


# an import statement at the start of a line: `from M import NAMES` (NAMES may be parenthesized
# over lines) or `import M, ...` (in a docstring too: only ever more sources); a regex, not ast:
# this runs at every `import edged` (tests/test_numba_env.py checks it agrees with ast)
_IMPORT = re.compile(rb"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)"
                     rb"|import[ \t]+([^\n#;]*))", re.M)


def _names(text: bytes) -> list[str]:
    """The imported names of `a as b, c` or `(a,\n b)`, without their aliases."""
    parts = text.decode().strip().strip("()").replace("\\", " ").split(",")
    return [p.split()[0] for p in parts if p.strip()]


def _imports(name: str, path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (a kernel factory may import inside a function),
    with `from m import x` also naming m.x in case x is a submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for m in _IMPORT.finditer(path.read_bytes()):
        if m.group(3) is not None:
            out.update(_names(m.group(3)))
            continue
        base = m.group(1).decode()
        level = len(base) - len(base.lstrip("."))
        if level:
            up = package.split(".")[: len(package.split(".")) - level + 1]
            base = ".".join(up + ([base[level:]] if base[level:] else []))
        out.add(base)
        out.update(f"{base}.{n}" for n in _names(m.group(2)))
    return out


def kernel_sources(root: Path | None = None) -> dict[str, Path]:
    """The kernel sources: the modules that import numba or llvmlite and, transitively, every
    edged module they import (its constants and helpers are compiled into the kernels).

    root: a checkout (edged/, quant/, backends/, models/ side by side); None: the installed packages.
    Scanned, never imported: this runs before numba may be imported.
    """
    mods = _modules(_package_dirs(root))
    graph: dict[str, set[str]] = {}  # module -> what it imports, parsed when first needed

    def deps(m: str) -> set[str]:
        if m not in graph:
            graph[m] = _imports(m, mods[m])
        return graph[m]

    def uses_kernel_lib(m: str) -> bool:
        text = mods[m].read_bytes()
        return any(lib.encode() in text for lib in _KERNEL_LIBS) and any(
            i.split(".")[0] in _KERNEL_LIBS for i in deps(m))

    todo = [m for m in mods if uses_kernel_lib(m)]
    found = set(todo)
    while todo:
        for dep in deps(todo.pop()):
            if dep in mods and dep not in found:
                found.add(dep)
                todo.append(dep)
    return {m: mods[m] for m in sorted(found)}


def kernel_source_hash(root: Path | None = None) -> str:
    """8 hex digits of SHA-256 over the kernel sources (kernel_sources), names and contents.

    Numba's cache only checks the file that defines a kernel; a kernel that inlines helpers or
    constants from another module would otherwise load stale machine code after that module
    changes. Modules no kernel imports (the server, chat templates, the CLI) are left out, so
    editing them keeps the compiled kernels.
    """
    import hashlib

    h = hashlib.sha256()
    for name, path in kernel_sources(root).items():
        h.update(name.encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:8]


# the settings configure_numba gives an imported Numba: variable -> (config attribute, Numba's
# default, whose type is the setting's)
_CONFIG = {
    "NUMBA_SLP_VECTORIZE": ("SLP_VECTORIZE", 0),
    "NUMBA_THREADING_LAYER": ("THREADING_LAYER", "default"),
    "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS": ("CUDA_LOW_OCCUPANCY_WARNINGS", 1),
    "NUMBA_CACHE_DIR": ("CACHE_DIR", ""),
}


def configure_numba() -> None:
    """Turn on SLP vectorization (VNNI codegen), the omp threading layer and a versioned JIT cache.

    The on-disk cache does not key on NUMBA_SLP_VECTORIZE, edged's version nor the helper modules a
    kernel inlines, so the directory name carries all three: an upgrade or an edit never loads stale
    machine code. Directories of earlier sources of the same version are pruned after a day.
    """
    imported = "numba" in sys.modules
    if imported and not _numba_untouched():
        return  # too late to change codegen settings; keep whatever the host process chose
    from edged import __version__

    unset = [name for name in _CONFIG if name not in os.environ]
    os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")
    os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")
    # decode launches grids smaller than the GPU by design: numba-cuda would warn at every new shape
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    if "NUMBA_CACHE_DIR" not in os.environ:
        slp = os.environ["NUMBA_SLP_VECTORIZE"]
        tag = f"edged-{__version__}_numba-{_numba_version()}_slp{slp}_src"
        root = cache_root() / "numba"
        os.environ["NUMBA_CACHE_DIR"] = str(root / (tag + kernel_source_hash()))
        _prune(root, tag, keep=Path(os.environ["NUMBA_CACHE_DIR"]).name)
    if imported:  # but idle (pytest's `-W error::numba.NumbaWarning` imports it first)
        from numba.core import config

        for name in unset:  # what edged set, where the host left Numba's default
            attr, default = _CONFIG[name]
            if getattr(config, attr) == default:
                setattr(config, attr, type(default)(os.environ[name]))


def _numba_untouched() -> bool:
    """Whether the imported Numba has compiled nothing and started no threads yet, so that the
    settings read at first use (cache directory, SLP, threading layer) can still be set: without
    them its cache sits beside the sources, keyed on the defining file only, and loads stale
    machine code after an edit to a helper module."""
    from numba.core.registry import cpu_target
    from numba.np.ufunc import parallel

    return "_toplevel_target_context" not in vars(cpu_target) and not parallel._is_initialized


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
