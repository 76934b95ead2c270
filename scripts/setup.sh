#!/usr/bin/env bash
# Sets up a Debian/Ubuntu machine for tilejit and builds it. Safe to run again: installs
# only missing packages, re-configures and builds incrementally.
#   scripts/setup.sh                    # build into ./build
#   TILEJIT_BUILD_DIR=out scripts/setup.sh
# Needs the CUDA toolkit (12.x/13.x, for NVRTC and headers) at /usr/local/cuda or
# $CUDAToolkit_ROOT; a GPU and its driver are needed only to run kernels.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${TILEJIT_BUILD_DIR:-build}"
PACKAGES=(cmake g++ ninja-build libfmt-dev doctest-dev llvm-15-dev libcli11-dev
          nlohmann-json3-dev libxxhash-dev libdlpack-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    SUDO=(sudo)
  fi
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

if [[ -z "${CUDAToolkit_ROOT:-}" && ! -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
  echo "setup: no CUDA toolkit found (looked for /usr/local/cuda/bin/nvcc and nvcc on PATH);" \
       "install the CUDA toolkit or set CUDAToolkit_ROOT" >&2
  exit 1
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built into $BUILD_DIR/ (try: $BUILD_DIR/tools/tilejit doctor)"
