#!/usr/bin/env bash
# Fill .whl/ with what bench/gpu_check.sh needs on a GPU machine without a package registry:
# edged's own wheel plus gguf, the one dependency its image lacks (it has numpy, numba, numba-cuda,
# llvmlite, click, jinja2, pyyaml, requests, tqdm and pytest with pytest-timeout; carrying those
# would shadow the image's own). Run here, where pip works; .whl/ is git-ignored and travels with `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
rm -rf .whl && mkdir -p .whl
"$py" -m pip wheel -q --no-deps -w .whl .   # isolated: the build needs setuptools >= 77, not the venv's
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform any -d .whl gguf
ls -la .whl
