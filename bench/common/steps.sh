# Sourced by the benchmark scripts that run on the GPU machine (bench/gemm/run.sh, bench/dsl/run.sh),
# after they set LOGS (a folder for the logs) and, optionally, STEP_SUMMARY_RE (the log lines a step's
# summary quotes). Sets up the environment for the carried .device/ bundle and defines:
#   say TEXT...                  print and append to $LOGS/summary.txt
#   step NAME SECONDS CMD...     run CMD under a time limit into $LOGS/NAME.txt; say its exit code,
#                                time and the matching log lines
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$LOGS"
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
export TILEJIT_CACHE_DIR=${TILEJIT_CACHE_DIR:-/tmp/tilejit_cache}
export PATH="/usr/local/cuda/bin:$PATH"
B=.device/bin
SUMMARY=$LOGS/summary.txt
say() { echo "$*" | tee -a "$SUMMARY"; }
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$LOGS/$name.txt" 2>&1
  local rc=$?
  say "$name: rc=$rc ($(( $(date +%s) - t0 )) s) $(grep -E "${STEP_SUMMARY_RE:-ERROR SUMMARY|RACECHECK SUMMARY|test cases:}" "$LOGS/$name.txt" | tail -2 | tr '\n' ' ')"
  return $rc
}
say "== $(date -u)"
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader 2>&1 || true) | tee -a "$SUMMARY"
