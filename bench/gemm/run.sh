#!/usr/bin/env bash
# The GEMM benchmark and checks on the GPU machine, in one command from the repository root,
# with .device/ carried (built here by: scripts/device_bundle.sh build bench/gemm/bench_gemm):
#
#   bash bench/gemm/run.sh [PHASE...]     PHASE: check, bench, sanitize (default: check bench)
#     check     the GEMM GPU tests (tilejit_tests "gpu: *gemm*"), bench_gemm --small, the PTX of
#               `tilejit show fp8_gemm --arch sm_90a --ptx`, SASS counts of the compiled configs (~1.5 min)
#     bench     bench_gemm (tilejit fp8_gemm + bf16 gemm, every shape and config) then
#               torch_bench.py (torch._scaled_mm acc/fast, torch.matmul bf16), merged into one table (~4 min)
#     sanitize  compute-sanitizer memcheck and racecheck on small fp8/bf16 GEMMs (~3 min)
#
# Output under $OUT (default /tmp/out): summary.txt, table.md (the merged table, also in summary),
# gemm_logs.tgz (every log and JSON-lines file). BENCH_ARGS / TORCH_ARGS: extra arguments, e.g.
# BENCH_ARGS="--shapes square --configs coop_128x256_c2".
set -u
PHASES="${*:-check bench}"
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
LOGS=/tmp/gemm_logs
STEP_SUMMARY_RE='ERROR SUMMARY|RACECHECK SUMMARY|test cases:|all small cases OK|FAILED$'
source bench/common/steps.sh
say "tilejit GEMM, phases: $PHASES"
for f in $B/bench_gemm $B/tilejit_tests $B/tilejit; do [ -x "$f" ] || say "missing $f (run scripts/device_bundle.sh build bench/gemm/bench_gemm here first)"; done

if has check; then
  mkdir -p $LOGS/cubins
  TJ_GEMM_DUMP_DIR=$LOGS/cubins step tests_gemm 300 $B/tilejit_tests -tc="gemm:*,gpu: fp8_gemm*,gpu: bf16 gemm*,gpu: fp8 operands*"
  grep -E "ERROR|FAILED|MESSAGE" $LOGS/tests_gemm.txt | head -20 | tee -a "$SUMMARY"
  step small 300 $B/bench_gemm --small
  grep FAIL $LOGS/small.txt | head -10 | tee -a "$SUMMARY"
  $B/tilejit show fp8_gemm --arch sm_90a --ptx > $LOGS/fp8_gemm.ptx 2>&1
  say "PTX: wgmma e4m3 $(grep -cE 'wgmma.mma_async.*e4m3' $LOGS/fp8_gemm.ptx), cp.async.bulk.tensor $(grep -c 'cp.async.bulk.tensor' $LOGS/fp8_gemm.ptx)"
  if command -v cuobjdump > /dev/null; then
    for c in $LOGS/cubins/*.cubin; do
      [ -f "$c" ] || continue
      cuobjdump -sass "$c" > "${c%.cubin}.sass" 2>&1
      s="${c%.cubin}.sass"
      say "SASS $(basename "${c%.cubin}"): GMMA $(grep -cE 'QGMMA|HGMMA' "$s") UTMALDG $(grep -c UTMALDG "$s") USETMAXREG $(grep -c USETMAXREG "$s") LDL/STL $(grep -cE '\bLDL|\bSTL' "$s")"
    done
  fi
fi

if has bench; then
  rm -f $LOGS/tilejit.jsonl $LOGS/torch.jsonl
  step bench_tilejit 420 $B/bench_gemm --out $LOGS/tilejit.jsonl ${BENCH_ARGS:-}
  grep -E "FAILED|DIFFERS|NaN" $LOGS/bench_tilejit.txt | head -10 | tee -a "$SUMMARY"
  step bench_torch 300 python3 bench/gemm/torch_bench.py --out $LOGS/torch.jsonl ${TORCH_ARGS:-}
  grep -iE "error|Traceback" $LOGS/bench_torch.txt | head -5 | tee -a "$SUMMARY"
  python3 bench/gemm/torch_bench.py --merge $LOGS/tilejit.jsonl $LOGS/torch.jsonl --table $LOGS/table.md > $LOGS/merge.txt 2>&1
  cat $LOGS/merge.txt | tee -a "$SUMMARY"
  cp $LOGS/table.md "$OUT/table.md" 2>/dev/null
fi

if has sanitize; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  step memcheck_fp8 300 "$CS" --tool memcheck --error-exitcode 9 $B/bench_gemm --small --configs coop_128x256_c2,ping_128x128_c2,coop_128x192_c2_promote1,coop_128x192_c2_promote4,default
  step racecheck_fp8 300 "$CS" --tool racecheck --error-exitcode 9 $B/bench_gemm --small --configs coop_128x256_c2,ping_64x256_c2
  step synccheck 200 "$CS" --tool synccheck --error-exitcode 9 $B/bench_gemm --small --configs coop_128x256_c1,default
fi

say "== done $(date -u)"
rm -rf $LOGS/cubins/*.cubin
tar czf "$OUT/gemm_logs.tgz" -C "$LOGS" .
cp "$SUMMARY" "$OUT/summary.txt"
