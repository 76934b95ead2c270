#!/usr/bin/env bash
# Builds the attention harness (bench/attention/attn_proto) with nvcc for sm_90a: the config
# groups of attn_configs.cu compile as separate translation units in parallel, then link.
# Usage (repository root): bash bench/attention/build.sh [BUILD_DIR]   (default build/attn)
# Writes BUILD_DIR/attn_proto, BUILD_DIR/build_*.txt (ptxas -v: registers, spills, the
# wgmma-serialization warning if any) and BUILD_DIR/resources.txt (one line per kernel).
# Works on a machine without a GPU (the binary then runs on the Hopper machine).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$ROOT/build/attn}
mkdir -p "$BUILD"
CUDA=${CUDA_HOME:-/usr/local/cuda}
NVCC="$CUDA/bin/nvcc"
FLAGS="-std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I$ROOT/codegen/device -I$ROOT/bench/attention -lineinfo"
JOBS=${JOBS:-$(nproc)}
t0=$(date +%s)
pids=()
for g in 0 1 2 3 4 5; do
  "$NVCC" $FLAGS -DCONFIG_GROUP=$g -Xptxas -v -c "$ROOT/bench/attention/attn_configs.cu" \
    -o "$BUILD/attn_configs_$g.o" > "$BUILD/build_group$g.txt" 2>&1 &
  pids+=($!)
  # at most JOBS compiles at once
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.5; done
done
"$NVCC" $FLAGS -DTJ_SPLIT_BUILD -Xptxas -v -c "$ROOT/bench/attention/attn_proto.cu" -o "$BUILD/attn_proto.o" \
  > "$BUILD/build_main.txt" 2>&1 &
pids+=($!)
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
if [ $ok -ne 1 ]; then
  echo "attn build: FAILED"; grep -h -E "error" "$BUILD"/build_*.txt | head -20; exit 1
fi
"$NVCC" -gencode=arch=compute_90a,code=sm_90a "$BUILD"/attn_configs_*.o "$BUILD/attn_proto.o" \
  -o "$BUILD/attn_proto" -L"$CUDA/lib64/stubs" -lcuda > "$BUILD/build_link.txt" 2>&1 || {
  echo "attn link: FAILED"; cat "$BUILD/build_link.txt" | head; exit 1; }
# one line per attention kernel: config template args, registers, spills
python3 - "$BUILD" <<'PY' > "$BUILD/resources.txt"
import re, sys, glob
out = []
for f in sorted(glob.glob(sys.argv[1] + "/build_group*.txt")):
    cur = None
    for line in open(f):
        m = re.search(r"Compiling entry function '(_ZN2tj3dev15attn_fwd_kernel\S*)'", line)
        if m:
            a = re.search(r"AttnCfgILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb(\d)ELb(\d)ELb(\d)ELb(\d)E", m.group(1))
            cur = "D=%s BN=%s stages=%s consumers=%s in=%s out=%s causal=%s overlap=%s wgsync=%s vperm=%s" % a.groups() if a else m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur: spill = m.groups()
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            out.append("%-100s regs %s stack %s spill st %s ld %s" % (cur, m.group(1), *spill)); cur = None
print("\n".join(out))
warn = [l.strip() for f in glob.glob(sys.argv[1] + "/build_*.txt") for l in open(f) if "Potential Performance Loss" in l or "C75" in l]
print("wgmma serialization warnings: %d" % len(warn))
for w in sorted(set(warn))[:5]: print("  " + w)
PY
echo "attn build: ok ($(( $(date +%s) - t0 )) s) -> $BUILD/attn_proto; $(grep -c 'spill st [1-9]' "$BUILD/resources.txt") kernels spill; $(tail -1 "$BUILD/resources.txt" | head -1)"
