#!/usr/bin/env bash
# The user-kernel benchmark and checks on the GPU machine, from the repository root, with .device/
# carried (built here by: scripts/device_bundle.sh build bench/dsl/bench_dsl):
#
#   bash bench/dsl/run.sh [PHASE...]     PHASE: check, sanitize, bench (default: check bench)
#     check     the generic lowering's GPU tests (tilejit_tests "gpu: *tensor cores*")
#     sanitize  compute-sanitizer memcheck and racecheck on those tests' smaller cases
#     bench     bench_dsl (user kernels, generic lowering and the library's fast paths), then
#               peers.py (torch) on the same problems, merged into one table
#
# Output under $OUT (default /tmp/out): summary.txt, table.md, dsl_logs.tgz. CASES: the case groups
# to time (default "gemm batched swiglu attention fp8 variants backward"); BENCH_ARGS: extra bench_dsl arguments (e.g.
# "--quick").
set -u
PHASES="${*:-check bench}"
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
LOGS=/tmp/dsl_logs
source bench/common/steps.sh
say "tilejit user kernels, phases: $PHASES"
TESTS='gpu: user GEMMs on the tensor cores*,gpu: a user GEMM with two programs*,gpu: f32 tile division*,gpu: README attention on the tensor cores*,gpu: attention variants written as user code*,gpu: a launch whose dots stay*,gpu: user kernels on mma.sync*,gpu: a grouped GEMM*,gpu: attention backward as user code*'
if has check; then
  step tests 300 $B/tilejit_tests -tc="$TESTS"
fi
if has sanitize; then
  step memcheck 240 compute-sanitizer --tool memcheck $B/tilejit_tests -tc="$TESTS"
  step racecheck 240 compute-sanitizer --tool racecheck $B/tilejit_tests -tc="gpu: README attention on the tensor cores*"
  step racecheck_mma_sync 240 compute-sanitizer --tool racecheck $B/tilejit_tests -tc="gpu: user kernels on mma.sync*"
fi
if has bench; then
  # One bench_dsl run per group of cases, each with its own time limit (a hang costs one group).
  : > "$LOGS/tilejit.jsonl"
  for group in ${CASES:-gemm batched swiglu attention fp8 variants backward}; do
    step "bench_$group" 240 $B/bench_dsl --cases "$group" --out "$LOGS/$group.jsonl" ${BENCH_ARGS:-}
    cat "$LOGS/bench_$group.txt"
    cat "$LOGS/$group.jsonl" >> "$LOGS/tilejit.jsonl" 2>/dev/null
  done
  step peers 300 python3 bench/dsl/peers.py --out "$LOGS/torch.jsonl" --problems "$LOGS/tilejit.jsonl"
  python3 bench/dsl/peers.py --merge "$LOGS/tilejit.jsonl" "$LOGS/torch.jsonl" --table "$OUT/table.md" | tee -a "$SUMMARY"
fi
cp "$SUMMARY" "$OUT/summary.txt"
tar czf "$OUT/dsl_logs.tgz" -C /tmp dsl_logs
