#!/usr/bin/env bash
# The one GPU check (issue 7): the GPU tests, then prefill/decode tokens/s on the CPU, fully
# offloaded and hybrid, as JSON. Finishes within 8 minutes; needs no package registry.
#
# On the GPU machine the image has numpy, numba, numba-cuda, llvmlite and click. Everything else
# travels as wheels in .whl/ (make them here, where pip works: bench/gpu_wheels.sh).
# Without a usable CUDA device it says so, and measures the CPU alone (a dry run).
#
# Usage: bench/gpu_check.sh [OUT_DIR]      (default: $OUT if set, else bench/results)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results}}"
mkdir -p "$out"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/edged-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/edged-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
start=$(date +%s)

# Python runs from a folder that holds only `tests`, so the installed wheel's edged (with
# edged.quant, .backends, .models) is imported, not the checkout's edged/ that only an editable
# install completes.
repo=$PWD
stage=$(mktemp -d)
ln -s "$repo/tests" "$stage/tests"
export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
case "$out" in /*) ;; *) out="$repo/$out" ;; esac
(cd "$stage" && "$py" -c "from edged.backends.cuda.probe import probe; print('gpu_check:', probe().describe())") \
  | tee "$out/gpu_device.txt"

# 1. the GPU kernel tests (they skip themselves without a real device)
(cd "$stage" && timeout 240 "$py" -m pytest -c "$repo/pyproject.toml" -o pythonpath= --rootdir "$stage" \
  tests/gpu -q -p no:cacheprovider) 2>&1 | tee "$out/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

# 2. speed: CPU, hybrid, full offload
timeout 300 "$py" bench/gpu_bench.py --out "$out/gpu_check.json" 2>&1 | tee "$out/gpu_bench.log"
bench_rc=${PIPESTATUS[0]}

echo "gpu_check: tests rc=$tests_rc, bench rc=$bench_rc, $(( $(date +%s) - start )) s; JSON: $out/gpu_check.json"
[ "$tests_rc" -eq 0 ] || [ "$tests_rc" -eq 5 ] || exit "$tests_rc"   # 5: every test skipped (no GPU)
exit "$bench_rc"
