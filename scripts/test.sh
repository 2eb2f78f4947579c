#!/usr/bin/env bash
# Builds everything and runs every test through ctest. GPU tests (label `gpu`) skip with a message
# where no GPU is visible. Arguments go to ctest, e.g. ./scripts/test.sh -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
