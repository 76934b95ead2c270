#!/usr/bin/env bash
# Prepares .embed/ (git-ignored) for the GPU machine, from a build that has tilejit-export:
#   .embed/export/               `tilejit export` of vector_add, attention and (when the library
#                                has them) the FP8 kernels for sm_90a, with test data; plus
#                                libtilejit_exports.so for tests/test_export_gpu.cpp
#   .embed/bin/embed_example     examples/embed/embed_example.c linked with the export and the
#                                toolkit's stub libcuda only (it loads the driver's libcuda there)
# Then carry `.embed` (and `.device`, from scripts/device_bundle.sh) and run
# scripts/embed_gpu_check.sh on the GPU machine.
#   scripts/embed_bundle.sh [BUILD_DIR]          (default: $TILEJIT_BUILD_DIR or build)
# $TILEJIT_EXPORT_ARCH (default sm_90a) picks the architecture.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${1:-${TILEJIT_BUILD_DIR:-build}}"
ARCH="${TILEJIT_EXPORT_ARCH:-sm_90a}"
EXPORT="$BUILD_DIR/tools/tilejit-export"
[[ -x "$EXPORT" ]] || { echo "embed_bundle: $EXPORT not built (needs llvm-15-dev)" >&2; exit 1; }
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
STUB="$CUDA_HOME/lib64/stubs/libcuda.so"
[[ -f "$STUB" ]] || STUB="$CUDA_HOME/lib/stubs/libcuda.so"

rm -rf .embed && mkdir -p .embed/bin
kernels=(vector_add attention)
shapes=(vector_add:dynamic=100003 vector_add:4096 attention:1,2,128,64)
export TILEJIT_CACHE_DIR="${TILEJIT_CACHE_DIR:-$PWD/.embed/cache}"
# The FP8 kernels, when the library has them and they compile for $ARCH (each is tried alone
# first, so one that does not build yet leaves the others in). Shapes: small enough for the
# CPU reference that checks them; edit to the shapes that matter.
optional=("fp8_gemm:256,512,128@e4m3" "attention_fp8:1,2,256,64@e4m3")
for entry in "${optional[@]}"; do
  k="${entry%%:*}"
  grep -q "\"$k\"" kernels/library.cpp || continue
  if "$EXPORT" "$k" --arch "$ARCH" --shapes "$entry" --both -q -o .embed/probe > .embed/probe.log 2>&1; then
    kernels+=("$k"); shapes+=("$entry")
  else
    echo "embed_bundle: leaving out $k: it does not export for $ARCH:" >&2
    grep -v "warning: " .embed/probe.log | tail -5 >&2
  fi
done
rm -rf .embed/probe .embed/probe.log
"$EXPORT" "${kernels[@]}" --arch "$ARCH" --shapes "${shapes[@]}" --both --test-data -o .embed/export
rm -rf .embed/cache

cc -std=c11 -O2 -Wall -Wextra -I.embed/export -I"$CUDA_HOME/include" examples/embed/embed_example.c \
  .embed/export/libtilejit_exports.a "$STUB" -lm -o .embed/bin/embed_example
cc -shared -o .embed/export/libtilejit_exports.so -Wl,--whole-archive .embed/export/libtilejit_exports.a \
  -Wl,--no-whole-archive "$STUB"
echo "embed_bundle: kernels ${kernels[*]} for $ARCH"
readelf -d .embed/bin/embed_example | grep NEEDED
du -sh .embed
