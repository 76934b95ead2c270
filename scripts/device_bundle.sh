#!/usr/bin/env bash
# Packs what the GPU machine needs to run tilejit's tests and tools into .device/ (git-ignored):
# stripped binaries from the build and the non-system libraries they link. Carry `.device`
# with the device tool and run there with: LD_LIBRARY_PATH=.device/lib .device/bin/<program>
# (or: source scripts/device_env.sh, which also finds NCCL for the ring programs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${1:-${TILEJIT_BUILD_DIR:-build}}"
rm -rf .device && mkdir -p .device/bin .device/lib
for exe in tests/tilejit_tests tools/tilejit examples/first_kernel "$@"; do
  [[ -f "$BUILD_DIR/$exe" ]] && strip -o ".device/bin/$(basename "$exe")" "$BUILD_DIR/$exe"
done
strip -o .device/lib/libtilejit.so.0.1 "$BUILD_DIR"/libtilejit.so.0.1.0
# Ring attention's library (dist/); NCCL itself is too big to carry (~210 MB): on the GPU machine
# put the NCCL wheel's lib folder on LD_LIBRARY_PATH too (scripts/device_env.sh does).
[[ -f "$BUILD_DIR"/libtilejit_dist.so ]] && strip -o .device/lib/libtilejit_dist.so "$BUILD_DIR"/libtilejit_dist.so
for lib in libfmt.so.9 libxxhash.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .device/lib/ 2>/dev/null || true
done
du -sh .device
