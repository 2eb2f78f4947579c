#!/usr/bin/env bash
# Builds everything and runs every test: the C++ suites through ctest (GPU tests, label `gpu`, skip
# with a message where no GPU is visible; arguments go to ctest, e.g. ./scripts/test.sh -L gpu),
# then the Python package's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"

# The Python package, installed as a user installs it (pip install .) into a virtual environment,
# then its tests (python/tests; those that need PyTorch and a GPU skip without them) and those of the
# measurement tools (tools/measure).
venv="${BUILD_DIR:-build}/venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check ".[test]"
"$venv/bin/python" -m pytest -q python/tests tools/measure
