#!/usr/bin/env bash
# Runs on the GPU machine, in the repo root, with .embed/ (scripts/embed_bundle.sh) and
# .device/ (scripts/device_bundle.sh) carried. Checks that the exported kernels run and match
# their references with libcuda alone, and measures launch overhead against the JIT path.
# Logs go to $OUT/embed_logs.tgz; a summary to stdout.
set -u
OUT=${OUT:-/tmp/out}
LOGS=/tmp/embed_logs; rm -rf $LOGS; mkdir -p $LOGS
say() { echo "$*" | tee -a $LOGS/summary.txt; }
status=0

# 1. The example needs no NVRTC and no tilejit library: its dependencies, and a run with every
#    directory holding NVRTC or tilejit removed from the library path (it also checks its own
#    /proc/self/maps).
ldd .embed/bin/embed_example > $LOGS/ldd.txt 2>&1
if grep -Eq 'nvrtc|tilejit|LLVM|not found' $LOGS/ldd.txt; then say "ldd: UNEXPECTED"; status=1; else say "ldd: only $(grep -o 'lib[a-z0-9_.-]*\.so[.0-9]*' $LOGS/ldd.txt | sort -u | tr '\n' ' ')"; fi
clean_path=""
IFS=: read -ra dirs <<< "${LD_LIBRARY_PATH:-}"
for d in "${dirs[@]}"; do
  [[ -z "$d" ]] && continue
  if compgen -G "$d/libnvrtc*" >/dev/null || compgen -G "$d/libtilejit*" >/dev/null; then continue; fi
  clean_path="${clean_path:+$clean_path:}$d"
done
say "library path for the example: '${clean_path}'"
env LD_LIBRARY_PATH="$clean_path" .embed/bin/embed_example .embed/export --bench > $LOGS/embed_example.txt 2>&1
rc=$?
say "embed_example: rc=$rc"
grep -E "MISMATCH|skipped|launch overhead|^OK|FAILED|mapped" $LOGS/embed_example.txt | head -40 | tee -a $LOGS/summary.txt
[[ $rc -eq 0 ]] || status=1

# 2. The exported launchers against the JIT path, in one process (tilejit_tests), and the
#    host time per launch of each.
if [[ -x .device/bin/tilejit_tests ]]; then
  TILEJIT_EXPORT_DIR=$PWD/.embed/export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}" \
    TILEJIT_CACHE_DIR=/tmp/tilejit_cache_embed .device/bin/tilejit_tests -tc='export (GPU)*' > $LOGS/export_gpu_tests.txt 2>&1
  rc=$?
  say "tilejit_tests export (GPU): rc=$rc"
  grep -E "launch overhead|SKIPPED|ERROR|FAILED|test cases" $LOGS/export_gpu_tests.txt | head -20 | tee -a $LOGS/summary.txt
  [[ $rc -eq 0 ]] || status=1
else
  say "no .device/bin/tilejit_tests: run scripts/device_bundle.sh and carry .device for the JIT comparison"
fi
tar czf $OUT/embed_logs.tgz -C $LOGS .
cp $LOGS/summary.txt $OUT/embed_summary.txt
exit $status
