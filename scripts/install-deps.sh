#!/usr/bin/env bash
# Installs what mxmoe's build needs and a fresh Debian/Ubuntu machine may lack: CMake, Ninja, g++,
# GoogleTest, nlohmann-json, and Python 3 with venv, from the distribution's packages. The CUDA
# toolkit (nvcc 13 with NVRTC and cuBLAS) is not installed here: it must already be under
# /usr/local/cuda or on PATH.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
for pkg in libgtest-dev nlohmann-json3-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# The Python package's build and tests run in a virtual environment (pip fetches the rest from PyPI).
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)

if ((${#need[@]})); then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing ${need[*]} and no apt-get to install them with" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

export PATH="/usr/local/cuda/bin:$PATH"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "install-deps: the CUDA toolkit 13 (nvcc) is required; install it under /usr/local/cuda" >&2
  exit 1
fi
