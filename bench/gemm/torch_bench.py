#!/usr/bin/env python3
"""Times torch._scaled_mm (cuBLASLt FP8) and torch.matmul (bf16) the way bench_gemm times tilejit,
and merges both JSON-lines files into one table.

  python3 bench/gemm/torch_bench.py --out torch.jsonl [--shapes all|square|llm|M,N,K;...] [--out-dtype bf16|f32]
  python3 bench/gemm/torch_bench.py --merge tilejit.jsonl torch.jsonl [--table table.md]

Method (as in bench_gemm.cpp): A [M,K] and B [N,K] ~ N(0,1) rounded to e4m3 (or bf16);
scale_a = 1.25, scale_b = 0.75 (per tensor); _scaled_mm(A, B.t(), out_dtype=bf16 or --out-dtype f32) with
use_fast_accum False (the default: cuBLASLt promotes the fp8 accumulation) and True;
torch.matmul(A_bf16, B_bf16.t()). Each sample is one call between two CUDA events, queued behind
torch.cuda._sleep so host overhead never shows; warm-up calls, then the median of --reps samples;
inputs rotate over enough copies to exceed 3x the L2 cache when they fit in it. Accuracy: relative
error against float64 on the dequantized inputs at 512 sampled entries plus the corners.
"""
import argparse
import json
import math
import statistics
import sys
import time

SCALE_A, SCALE_B = 1.25, 0.75


def shapes_for(spec):
    out = []
    if spec in ("all", "square"):
        out += [(n, n, n, "square") for n in (1024, 2048, 4096, 8192, 16384)]
    if spec in ("all", "llm"):
        out += [(8192, n, k, "llm") for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))]
    if not out:
        for part in spec.split(";"):
            m, n, k = (int(x) for x in part.split(","))
            out.append((m, n, k, "custom"))
    return out


def bench(args):
    import torch

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {l2 >> 20} MB; torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}", flush=True)
    # cycles per ms for torch.cuda._sleep
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    torch.cuda._sleep(1_000_000)
    t1.record()
    torch.cuda.synchronize()
    cycles_per_ms = 1_000_000 / max(t0.elapsed_time(t1), 1e-3)

    def timed(fn, copies):
        for i in range(args.warmup):
            fn(i % copies)
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.reps)]
        torch.cuda._sleep(int(cycles_per_ms * min(50.0, max(2.0, args.reps * 0.25))))
        for i in range(args.reps):
            ev[i][0].record()
            fn(i % copies)
            ev[i][1].record()
        torch.cuda.synchronize()
        samples = [a.elapsed_time(b) for a, b in ev]
        return statistics.median(samples), samples

    def accuracy(c, a, b, scale):
        M, N = c.shape
        g = torch.Generator(device="cpu").manual_seed(7)
        ii = torch.randint(0, M, (512,), generator=g).tolist() + [0, 0, M - 1, M - 1]
        jj = torch.randint(0, N, (512,), generator=g).tolist() + [0, N - 1, 0, N - 1]
        ii = torch.tensor(ii, device=dev)
        jj = torch.tensor(jj, device=dev)
        def rows(t, idx):  # gather rows (fp8 through its bytes: indexing kernels may lack fp8)
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                return t.view(torch.uint8)[idx].view(t.dtype).float().double()
            return t[idx].float().double()
        ref = (rows(a, ii) * rows(b, jj)).sum(1) * scale
        out = c[ii, jj].float().double()
        nan = int(torch.isnan(out).sum())
        d = (out - ref)
        d = torch.where(torch.isnan(d), torch.zeros_like(d), d)
        rms = float(ref.pow(2).mean().sqrt())
        rel_rms = float(d.pow(2).sum().sqrt() / ref.pow(2).sum().sqrt().clamp_min(1e-300))
        max_rel = float((d.abs() / (ref.abs() + rms)).max())
        return rel_rms, max_rel, nan

    with open(args.out, "a") as f:
        for (M, N, K, group) in shapes_for(args.shapes):
            flops = 2.0 * M * N * K
            t_start = time.time()
            torch.manual_seed(M * 7 + N * 13 + K)
            ws_fp8 = M * K + N * K + 2 * M * N
            copies = min(64, math.ceil(3 * l2 / ws_fp8)) if ws_fp8 < 3 * l2 else 1
            a8 = [torch.randn(M, K, device=dev).to(torch.float8_e4m3fn) for _ in range(copies)]
            b8 = [torch.randn(N, K, device=dev).to(torch.float8_e4m3fn) for _ in range(copies)]
            sa = torch.tensor(SCALE_A, device=dev, dtype=torch.float32)
            sb = torch.tensor(SCALE_B, device=dev, dtype=torch.float32)
            outs = [None] * copies
            out_dtype = torch.float32 if args.out_dtype == "f32" else torch.bfloat16
            for fast in (False, True):
                def fn(i, fast=fast):
                    outs[i] = torch._scaled_mm(a8[i], b8[i].t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                                               use_fast_accum=fast)
                try:
                    ms, samples = timed(fn, copies)
                    rel_rms, max_rel, nan = accuracy(outs[0], a8[0], b8[0], SCALE_A * SCALE_B)
                    rec = dict(impl="torch", kernel="_scaled_mm", fast_accum=fast, **{"in": "e4m3"}, out=args.out_dtype, M=M, N=N, K=K,
                               ms=ms, tflops=flops / (ms * 1e-3) / 1e12, rel_rms=rel_rms, max_rel=max_rel, nan=nan,
                               samples=len(samples), copies=copies)
                except Exception as e:  # noqa: BLE001 - report and go on
                    rec = dict(impl="torch", kernel="_scaled_mm", fast_accum=fast, M=M, N=N, K=K, error=str(e)[:300])
                print(json.dumps(rec), flush=True)
                f.write(json.dumps(rec) + "\n")
            del a8, b8, outs
            torch.cuda.empty_cache()
            if args.out_dtype != "bf16":   # torch.matmul's bf16 table is the bf16-output run's
                print(f"  ({M}x{N}x{K}: {time.time() - t_start:.1f} s)", flush=True)
                continue

            ws_bf = 2 * (M * K + N * K + M * N)
            copies = min(64, math.ceil(3 * l2 / ws_bf)) if ws_bf < 3 * l2 else 1
            a16 = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
            b16 = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
            c16 = [torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(copies)]

            def fn16(i):
                torch.matmul(a16[i], b16[i].t(), out=c16[i])
            try:
                ms, samples = timed(fn16, copies)
                rel_rms, max_rel, nan = accuracy(c16[0], a16[0], b16[0], 1.0)
                rec = dict(impl="torch", kernel="matmul", **{"in": "bf16"}, out="bf16", M=M, N=N, K=K, ms=ms,
                           tflops=flops / (ms * 1e-3) / 1e12, rel_rms=rel_rms, max_rel=max_rel, nan=nan,
                           samples=len(samples), copies=copies)
            except Exception as e:  # noqa: BLE001
                rec = dict(impl="torch", kernel="matmul", M=M, N=N, K=K, error=str(e)[:300])
            print(json.dumps(rec), flush=True)
            f.write(json.dumps(rec) + "\n")
            del a16, b16, c16
            torch.cuda.empty_cache()
            print(f"  ({M}x{N}x{K}: {time.time() - t_start:.1f} s)", flush=True)


def load(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        recs.append(json.loads(line))
                    except json.JSONDecodeError:
                        print(f"skipping a bad line in {p}: {line[:80]}", file=sys.stderr)
    return recs


def merge(args):
    recs = load(args.merge)
    shapes = []
    for r in recs:
        s = (r.get("M"), r.get("N"), r.get("K"))
        if None not in s and s not in shapes:
            shapes.append(s)

    def best(pred):
        c = [r for r in recs if pred(r) and "tflops" in r and not r.get("nan")]
        return max(c, key=lambda r: r["tflops"]) if c else None

    def fmt_tf(r):
        return f"{r['tflops']:.1f}" if r else "—"

    def ratio(a, b):
        return f"{a['tflops'] / b['tflops']:.3f}" if a and b else "—"

    def err(r):
        return f"{r['rel_rms']:.1e}" if r and "rel_rms" in r else "—"

    lines = []
    outs = [o for o in ("bf16", "f32") if any(r.get("kernel") in ("fp8_gemm", "_scaled_mm") and "tflops" in r
                                              and r.get("out", "bf16") == o for r in recs)]
    for out in outs:
        lines.append(f"FP8 (e4m3 x e4m3, per-tensor scales, {out} out), TFLOP/s. \"promoted\": fp32 accumulation outside the "
                     "tensor core (tilejit's default, `_scaled_mm`'s default); \"fast\": the tensor core's own accumulation "
                     "(tilejit knob promote = 0, `use_fast_accum=True`):")
        lines.append("")
        lines.append("| M×N×K | tilejit promoted | config | _scaled_mm | **ratio** | tilejit fast | config | _scaled_mm fast | "
                     "**ratio fast** | rel err tilejit promoted | _scaled_mm | tilejit fast | _scaled_mm fast |")
        lines.append("| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for (M, N, K) in shapes:
            same = lambda r: (r.get("M"), r.get("N"), r.get("K")) == (M, N, K) and r.get("out", "bf16") == out  # noqa: E731
            tjf = best(lambda r: same(r) and r.get("impl") == "tilejit" and r.get("kernel") == "fp8_gemm" and not r.get("promote"))
            tjp = best(lambda r: same(r) and r.get("impl") == "tilejit" and r.get("kernel") == "fp8_gemm" and r.get("promote"))
            acc = best(lambda r: same(r) and r.get("kernel") == "_scaled_mm" and not r.get("fast_accum"))
            fast = best(lambda r: same(r) and r.get("kernel") == "_scaled_mm" and r.get("fast_accum"))
            if not (tjf or tjp or acc or fast):
                continue
            lines.append(f"| {M}×{N}×{K} | {fmt_tf(tjp)} | {tjp['config'] if tjp else '—'} | {fmt_tf(acc)} | **{ratio(tjp, acc)}** | "
                         f"{fmt_tf(tjf)} | {tjf['config'] if tjf else '—'} | {fmt_tf(fast)} | **{ratio(tjf, fast)}** | "
                         f"{err(tjp)} | {err(acc)} | {err(tjf)} | {err(fast)} |")
        lines.append("")
    if not any(r.get("kernel") in ("gemm", "matmul") and "tflops" in r for r in recs):
        lines.append("(no bf16 GEMM measurements)")
    lines.append("")
    lines.append("bf16 (bf16 x bf16, fp32 accumulation, bf16 out), TFLOP/s:")
    lines.append("")
    lines.append("| M×N×K | tilejit | tilejit config | torch.matmul | **tilejit / torch** | rel err tilejit | rel err torch |")
    lines.append("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for (M, N, K) in shapes:
        same = lambda r: (r.get("M"), r.get("N"), r.get("K")) == (M, N, K)  # noqa: E731
        tj = best(lambda r: same(r) and r.get("impl") == "tilejit" and r.get("kernel") == "gemm")
        th = best(lambda r: same(r) and r.get("kernel") == "matmul")
        if not (tj or th):
            continue
        lines.append(f"| {M}×{N}×{K} | {fmt_tf(tj)} | {tj['config'] if tj else '—'} | {fmt_tf(th)} | **{ratio(tj, th)}** | "
                     f"{err(tj)} | {err(th)} |")
    checks = [r for r in recs if "tj_launch_check" in r]
    if checks:
        bad = [r for r in checks if r["tj_launch_check"] != "identical"]
        lines.append("")
        lines.append(f"tj::launch vs the benchmark's own launcher (best config per shape): {len(checks) - len(bad)} of "
                     f"{len(checks)} identical" + ("" if not bad else f"; NOT identical: {[(r['kernel'], r['M'], r['N'], r['K'], r['tj_launch_check']) for r in bad]}"))
    errors = [r for r in recs if "error" in r]
    if errors:
        lines.append("")
        lines.append(f"{len(errors)} failed measurements:")
        for r in errors[:20]:
            lines.append(f"- {r.get('impl')} {r.get('kernel')} {r.get('M')}x{r.get('N')}x{r.get('K')} {r.get('config', '')}: "
                         f"{r['error'][:160]}")
    text = "\n".join(lines)
    print(text)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="torch_gemm.jsonl")
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out-dtype", choices=("bf16", "f32"), default="bf16", help="_scaled_mm's output type")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--merge", nargs="+", help="merge these JSON-lines files into a table instead of benchmarking")
    ap.add_argument("--table", help="also write the merged table (markdown) here")
    args = ap.parse_args()
    if args.merge:
        merge(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
