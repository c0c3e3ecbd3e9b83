#!/usr/bin/env bash
# Fill .whl/ with what bench/gpu_check.sh needs on a GPU machine without a package registry:
# edged's own wheel plus the dependencies its image lacks (it has numpy, numba, numba-cuda,
# llvmlite, click). Run here, where pip works; .whl/ is git-ignored and travels with `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
rm -rf .whl && mkdir -p .whl
"$py" -m pip wheel -q --no-deps --no-build-isolation -w .whl .
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl \
  gguf pyyaml requests tqdm idna urllib3 certifi charset-normalizer \
  pytest pluggy iniconfig packaging pygments
ls -la .whl
