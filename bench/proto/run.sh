#!/usr/bin/env bash
# Builds and runs the sm_90a prototype on a Hopper GPU machine. Run from the repository root:
#   bash bench/proto/run.sh [PHASE...]      PHASE: test, bench, sanitize (default: all three)
#   test      build, NVRTC check, SASS counts, unit tests, GEMM --debug and --small (~2 min)
#   bench     GEMM timing table vs cuBLASLt (~2 min)
#   sanitize  compute-sanitizer memcheck + racecheck on small shapes (~3-5 min)
# Binaries are kept in $BUILD_DIR (default /tmp/tj_proto_build) and rebuilt only when a source
# is newer, so `run.sh test bench` then `run.sh sanitize` fit separate 10-minute calls.
# Logs go to $OUT (default /tmp/out): build_*.txt (ptxas register/spill report), nvrtc.txt,
# unit.txt, gemm_debug.txt, gemm_small.txt, gemm_bench.txt, memcheck*.txt, racecheck.txt,
# sass_counts.txt, summary.txt (appended by every phase).
# Knobs: BENCH_ARGS="..." (extra fp8_gemm_proto arguments, e.g. "--config pingpong --group 16").
set -u
PHASES="${*:-test bench sanitize}"
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
CUDA=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA/bin:$PATH"
BUILD=${BUILD_DIR:-/tmp/tj_proto_build}
mkdir -p "$BUILD"
ROOT=$(pwd)
SUMMARY="$OUT/summary.txt"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "== tilejit sm_90a prototype, phases: $PHASES, $(date -u)"
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv 2>&1 || true) | tee "$OUT/nvidia-smi.txt" | tee -a "$SUMMARY"
nvcc --version | tail -2 | tee -a "$SUMMARY"

FLAGS="-std=c++17 -gencode=arch=compute_90a,code=sm_90a -I$ROOT/codegen/device -lineinfo"
LIBS="-lcuda -L$CUDA/lib64/stubs"

build() {  # name src extra-flags extra-libs
  local name=$1 src=$2 extra=$3 libs=$4
  local t0=$(date +%s)
  local newer
  newer=$(find "$src" "$ROOT"/codegen/device/*.cuh -newer "$BUILD/$name" 2>/dev/null | head -1)
  if [ -x "$BUILD/$name" ] && [ -z "$newer" ]; then
    note "build $name: up to date"
    return 0
  fi
  if nvcc $FLAGS $extra -Xptxas -v "$src" -o "$BUILD/$name" $libs > "$OUT/build_$name.txt" 2>&1; then
    note "build $name: ok ($(( $(date +%s) - t0 )) s); kernels with spills: $(grep -cE ' [1-9][0-9]* bytes spill (stores|loads)' "$OUT/build_$name.txt")"
    grep -E "C75|Potential Performance Loss" "$OUT/build_$name.txt" | sort | uniq -c | head -5 | tee -a "$SUMMARY"
    return 0
  fi
  note "build $name: FAILED (see build_$name.txt)"
  tail -20 "$OUT/build_$name.txt"
  return 1
}

build hopper_unit "$ROOT/bench/proto/hopper_unit.cu" "-O2" "$LIBS" &
P1=$!
build fp8_gemm_proto "$ROOT/bench/proto/fp8_gemm_proto.cu" "-O3" "$LIBS -lcublasLt -lcublas" &
P2=$!
g++ -std=c++17 -O2 "$ROOT/bench/proto/nvrtc_check.cpp" -I"$CUDA/include" -L"$CUDA/lib64" -lnvrtc \
    -Wl,-rpath,"$CUDA/lib64" -o "$BUILD/nvrtc_check" > "$OUT/build_nvrtc_check.txt" 2>&1 \
  && note "build nvrtc_check: ok" || note "build nvrtc_check: FAILED"
wait $P1; U_OK=$?
wait $P2; G_OK=$?

# NVRTC: the headers as generated code will see them (sm_90a and sm_80)
if has test && [ -x "$BUILD/nvrtc_check" ]; then
  timeout 120 "$BUILD/nvrtc_check" "$ROOT/codegen/device" "$BUILD" > "$OUT/nvrtc.txt" 2>&1
  note "nvrtc_check: exit $? -- $(tail -1 "$OUT/nvrtc.txt")"
fi

# SASS: tensor-core and TMA instructions present, no local memory in the GEMM kernels
if has test && [ $G_OK -eq 0 ]; then
  cuobjdump -sass "$BUILD/fp8_gemm_proto" > "$BUILD/fp8_gemm_proto.sass" 2>&1
  {
    echo "QGMMA: $(grep -c QGMMA "$BUILD/fp8_gemm_proto.sass")"
    echo "UTMALDG: $(grep -c UTMALDG "$BUILD/fp8_gemm_proto.sass")"
    echo "UTMALDG multicast: $(grep -c 'UTMALDG.*MULTICAST' "$BUILD/fp8_gemm_proto.sass")"
    echo "USETMAXREG: $(grep -c USETMAXREG "$BUILD/fp8_gemm_proto.sass")"
    echo "local memory (LDL/STL): $(grep -cE '\bLDL|\bSTL' "$BUILD/fp8_gemm_proto.sass")"
    grep -o "QGMMA[^ ]*" "$BUILD/fp8_gemm_proto.sass" | sort | uniq -c
  } > "$OUT/sass_counts.txt"
  note "SASS: $(tr '\n' ';' < "$OUT/sass_counts.txt" | cut -c1-200)"
fi

# Unit tests: conversions (exhaustive), descriptors/swizzles, RS chains, TMA
if has test && [ $U_OK -eq 0 ]; then
  timeout 300 "$BUILD/hopper_unit" > "$OUT/unit.txt" 2>&1
  note "hopper_unit: exit $? -- $(tail -1 "$OUT/unit.txt")"
  grep FAIL "$OUT/unit.txt" | head -20 | tee -a "$SUMMARY"
fi

if [ $G_OK -eq 0 ]; then
  if has test; then
    # 128x128x128 with A = identity: C must equal B^T; prints a corner on mismatch
    timeout 120 "$BUILD/fp8_gemm_proto" --debug > "$OUT/gemm_debug.txt" 2>&1
    note "gemm --debug: exit $? -- $(tail -1 "$OUT/gemm_debug.txt")"
    grep -E "MISMATCH|HANG" "$OUT/gemm_debug.txt" | head -8 | tee -a "$SUMMARY"
    timeout 240 "$BUILD/fp8_gemm_proto" --small > "$OUT/gemm_small.txt" 2>&1
    note "gemm --small: exit $? -- $(tail -1 "$OUT/gemm_small.txt")"
    grep -E "MISMATCH|FAIL|HANG" "$OUT/gemm_small.txt" | head -10 | tee -a "$SUMMARY"
  fi
  if has bench; then
    timeout 400 "$BUILD/fp8_gemm_proto" ${BENCH_ARGS:-} > "$OUT/gemm_bench.txt" 2>&1
    note "gemm bench: exit $?"
    grep -E "HANG|CUDA error" "$OUT/gemm_bench.txt" | head -5 | tee -a "$SUMMARY"
    sed -n '/^shape /,$p' "$OUT/gemm_bench.txt" | tee -a "$SUMMARY"
  fi
  if has sanitize; then
    CS=$(command -v compute-sanitizer || echo "$CUDA/bin/compute-sanitizer")
    timeout 240 "$CS" --tool memcheck --error-exitcode 9 "$BUILD/fp8_gemm_proto" --small --no-cublas \
      > "$OUT/memcheck.txt" 2>&1
    note "memcheck: exit $? -- $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.txt" | tail -1)"
    timeout 200 "$CS" --tool racecheck --error-exitcode 9 "$BUILD/fp8_gemm_proto" --small --no-cublas \
      --shape 256,384,512 > "$OUT/racecheck.txt" 2>&1
    note "racecheck: exit $? -- $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.txt" | tail -1)"
    timeout 120 "$CS" --tool memcheck --error-exitcode 9 "$BUILD/hopper_unit" --no-conv \
      > "$OUT/memcheck_unit.txt" 2>&1
    note "memcheck hopper_unit: exit $? -- $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_unit.txt" | tail -1)"
  fi
fi
note "== done; logs in $OUT"
