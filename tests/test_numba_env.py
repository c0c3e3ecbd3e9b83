"""The Numba cache directory is keyed on kernel sources only: editing the server or chat code
keeps compiled kernels, editing a kernel or a module a kernel imports recompiles them."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edged import _numba_env
from edged._numba_env import kernel_source_hash, kernel_sources

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tree(tmp_path):
    """A copy of the package sources laid out as the checkout is."""
    for d in ("edged", "quant", "backends", "models"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _touch(path: Path) -> None:
    path.write_text(path.read_text() + "\n# edited\n")


@pytest.mark.parametrize("module", ["edged/chat.py", "edged/server/app.py", "edged/cli/serve.py",
                                    "edged/sampling.py", "edged/engine/engine.py", "models/gemma3.py"])
def test_editing_a_non_kernel_module_keeps_the_key(tree, module):
    before = kernel_source_hash(tree)
    _touch(tree / module)
    assert kernel_source_hash(tree) == before


@pytest.mark.parametrize("module", ["backends/cpu/activations.py", "backends/cpu/sampling.py",
                                    "edged/tokenizer/spm.py", "quant/types.py"])
def test_editing_a_kernel_source_changes_the_key(tree, module):
    before = kernel_source_hash(tree)
    _touch(tree / module)  # quant/types.py: no numba, but its constants are compiled into kernels
    assert kernel_source_hash(tree) != before


def test_a_new_kernel_module_changes_the_key(tree):
    before = kernel_source_hash(tree)
    (tree / "backends/cpu/new_kernel.py").write_text("import numba\n\nfrom edged.chat import x\n")
    assert kernel_source_hash(tree) != before
    assert "edged.chat" in kernel_sources(tree)  # what a kernel module imports is a kernel source


def test_kernel_sources_and_the_installed_lookup():
    found = kernel_sources(ROOT)
    for m in ("edged.backends.cpu.activations", "edged.backends.cpu.sampling", "edged.tokenizer.spm",
              "edged.quant.types", "edged.backends.cpu.fastexp"):
        assert m in found, m
    for m in ("edged.chat", "edged.server.app", "edged.sampling", "edged.engine.engine", "edged.cli"):
        assert m not in found, m
    assert kernel_source_hash() == kernel_source_hash(ROOT)  # this checkout is what Python imports


def test_import_scan_matches_the_parser_on_every_module():
    """The regex that finds imports (fast enough for every `import edged`) agrees with ast."""
    mods = _numba_env._modules(_numba_env._package_dirs(ROOT))
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        want = set()
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                want.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module
                want.add(base)
                want.update(f"{base}.{a.name}" for a in node.names)
        assert _numba_env._imports(name, path) == want, name


def _config_after(code: str, tmp_path) -> list[str]:
    """NUMBA_CACHE_DIR, SLP and threading layer settings after `code` then `import edged`, in a
    fresh interpreter with its own cache root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    script = code + "\nimport edged\nfrom numba.core import config\n" \
        "print(config.CACHE_DIR, config.SLP_VECTORIZE, config.THREADING_LAYER, sep='|')"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().split("|")


def test_numba_imported_first_but_idle_still_gets_edged_settings(tmp_path):
    """pytest's `-W error::numba.NumbaWarning` imports numba before edged: the versioned cache
    (not one beside the sources, which would load stale kernels after a helper module changes),
    SLP and omp still apply while Numba has compiled nothing."""
    cache_dir, slp, layer = _config_after("import numba", tmp_path)
    assert Path(cache_dir).is_relative_to(tmp_path) and slp == "1" and layer == "omp"


def test_a_host_that_compiled_first_keeps_its_numba_settings(tmp_path):
    """Once the host process has compiled, edged changes none of its settings."""
    out = _config_after("import numba\nnumba.njit(lambda x: x + 1)(1)", tmp_path)
    assert out[1] == "0" and not out[0].startswith(str(tmp_path))


def test_an_idle_host_keeps_what_it_set_in_numba_config(tmp_path):
    """A host that set Numba's config in code (not the environment) before importing edged keeps
    that setting; edged fills in the ones it left at Numba's defaults."""
    cache_dir, slp, layer = _config_after("import numba\nnumba.config.THREADING_LAYER = 'workqueue'", tmp_path)
    assert layer == "workqueue" and slp == "1" and Path(cache_dir).is_relative_to(tmp_path)
