"""The wheel installs one import name, `edged`, and every source package is in it."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent


def test_every_source_package_is_listed_under_the_edged_name():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, dirs = cfg["packages"], cfg["package-dir"]
    assert all(p == "edged" or p.startswith("edged.") for p in packages)
    # map each listed package to its folder, then find folders with __init__.py not listed
    listed = set()
    for pkg in packages:
        base = max((k for k in dirs if pkg == k or pkg.startswith(k + ".")), key=len)
        rest = pkg[len(base):].lstrip(".").replace(".", "/")
        listed.add((ROOT / dirs[base] / rest).resolve())
    for top in ("edged", "quant", "backends", "models"):
        for init in (ROOT / top).rglob("__init__.py"):
            assert init.parent.resolve() in listed, f"{init.parent} is not in pyproject packages"
