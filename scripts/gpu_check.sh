#!/usr/bin/env bash
# Runs on the GPU machine (device tool), in the repo root, with .device/ carried
# (scripts/device_bundle.sh). Runs the test suite, the demo, the first example and
# compute-sanitizer on generated kernels; logs go to $OUT/gpu_logs.tgz, a summary to stdout.
set -u
OUT=${OUT:-/tmp/out}
LOGS=/tmp/gpu_logs; rm -rf $LOGS; mkdir -p $LOGS
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}" TILEJIT_CACHE_DIR=/tmp/tilejit_cache
B=.device/bin
say() { echo "$*" | tee -a $LOGS/summary.txt; }
step() {  # name, command...
  local name=$1; shift
  local t0=$(date +%s)
  "$@" > "$LOGS/$name.txt" 2>&1
  local rc=$?
  say "$name: rc=$rc ($(( $(date +%s) - t0 )) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases:|MISMATCH|OK$' "$LOGS/$name.txt" | tail -2 | tr '\n' ' ')"
}
step doctor $B/tilejit doctor
step tests $B/tilejit_tests
grep -E "SKIPPED|ERROR|FAILED" $LOGS/tests.txt | head -20 | tee -a $LOGS/summary.txt
step demo $B/tilejit demo
step first_kernel $B/first_kernel
CS=compute-sanitizer
for tool in memcheck racecheck; do
  step ${tool}_attention_bf16 $CS --tool $tool --error-exitcode 9 $B/tilejit run attention --dtype bf16 --shape 1,2,100,64 --causal --repeats 1
  step ${tool}_attention_e4m3 $CS --tool $tool --error-exitcode 9 $B/tilejit run attention --dtype e4m3 --shape 1,1,96,64 --repeats 1
  step ${tool}_softmax $CS --tool $tool --error-exitcode 9 $B/tilejit run softmax --dtype f16 --shape 5,300 --repeats 1
  step ${tool}_vector_add $CS --tool $tool --error-exitcode 9 $B/tilejit run vector_add --dtype bf16 --shape 4099 --repeats 1
done
for extra in "$@"; do step extra_$(echo "$extra" | tr -c 'a-zA-Z0-9' _ | cut -c1-40) bash -c "$extra"; done
tar czf $OUT/gpu_logs.tgz -C $LOGS .
cp $LOGS/summary.txt $OUT/summary.txt
