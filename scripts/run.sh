#!/usr/bin/env bash
# The main job from a fresh clone: install what is missing, build, and run one MoE layer with
# `mxmoe run` (the embedded gpt-oss-20b shape by default; the GPU if there is one, else the CPU).
# Arguments go to `mxmoe run`, e.g. ./scripts/run.sh --model gpt-oss-120b --tokens 8 --check
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
exec "${BUILD_DIR:-build}/mxmoe" run "$@"
