#!/usr/bin/env bash
# Build llama-server from the llama.cpp that llama-cpp-python vendors, so the
# benchmark compares llamaq against the very same inference code.
#
#   bench/build_llama_server.sh            # builds ~/.cache/llamaq-bench/bin/llama-server
#
# Environment:
#   LCP_VERSION   llama-cpp-python version whose sdist is used (default 0.3.36)
#   LCP_SRC       an extracted llama.cpp tree to use instead of downloading the sdist
#   CMAKE_ARGS    CPU flags; default: the project's x86_64 flags (AVX2/FMA/F16C, no -march=native)
#   BENCH_CACHE   output folder (default ~/.cache/llamaq-bench)
#   JOBS          parallel compile jobs (default 2)
#
# Idempotent: does nothing when the binary already exists. Nothing of llama.cpp is
# written inside the repository.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
version="${LCP_VERSION:-0.3.36}"
cache="${BENCH_CACHE:-$HOME/.cache/llamaq-bench}"
jobs="${JOBS:-2}"
binary="$cache/bin/llama-server"

if [[ -x "$binary" ]]; then
    echo "llama-server already built: $binary"
    exit 0
fi

mkdir -p "$cache"

src="${LCP_SRC:-}"
if [[ -z "$src" ]]; then
    prebuilt="/tmp/lcpsrc/llama_cpp_python-$version/vendor/llama.cpp"
    if [[ -f "$prebuilt/CMakeLists.txt" ]]; then
        src="$prebuilt"
    else
        sdist_dir="$cache/sdist"
        src="$sdist_dir/llama_cpp_python-$version/vendor/llama.cpp"
        if [[ ! -f "$src/CMakeLists.txt" ]]; then
            pip="$repo/.venv/bin/pip"
            [[ -x "$pip" ]] || pip="pip"
            mkdir -p "$sdist_dir"
            "$pip" download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$sdist_dir"
            tar -xzf "$sdist_dir/llama_cpp_python-$version.tar.gz" -C "$sdist_dir"
        fi
    fi
fi
echo "llama.cpp source: $src"

# Same CPU flags as the project's llama-cpp-python build on x86_64 (portable, no -march=native).
cpu_args="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON}"

build="$cache/build-$version"
# shellcheck disable=SC2086  # cpu_args is a list of flags on purpose
cmake -S "$src" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    $cpu_args

nice -n 19 cmake --build "$build" --target llama-server -j "$jobs"

mkdir -p "$cache/bin"
cp "$build/bin/llama-server" "$binary"
echo "built: $binary"
"$binary" --version || true
