#!/usr/bin/env bash
# Configures and builds mxmoe (library, `mxmoe` command, tests) into ${BUILD_DIR:-build}.
# Extra arguments go to CMake's configure step, e.g. -DCMAKE_BUILD_TYPE=Debug.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
build_dir="${BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
