#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama.cpp that llama-cpp-python vendors (same version as the
# in-process engine), for the adapter tests. Prints the binary's path. Cached: about 13 minutes cold on
# two cores, instant afterwards.
# Usage: tools/build_llama_server.sh [CACHE_DIR]   (default: $XDG_CACHE_HOME/enginegate or ~/.cache/enginegate)
set -euo pipefail
version=0.3.36
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/enginegate}
prefix="$cache/llama-server-$version"
bin="$prefix/build/bin/llama-server"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$prefix"
work=$(mktemp -d "$prefix/src.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The sdist comes from PyPI like any package; it carries llama.cpp under vendor/.
python3 -m pip download --quiet --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$version" >&2
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
configure() {
  "${CMAKE:-cmake}" -S "$work/llama_cpp_python-$version/vendor/llama.cpp" -B "$prefix/build" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >&2
}
# A build directory left by an interrupted run points at a deleted source tree, and a compiler check
# once failed under heavy load ("This should not have happened"): start clean, and retry once clean.
rm -rf "$prefix/build"
configure || { rm -rf "$prefix/build"; configure; }
"${CMAKE:-cmake}" --build "$prefix/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >&2
echo "$bin"
