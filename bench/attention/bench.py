#!/usr/bin/env python3
"""Attention forward peers on the issue's shapes, merged with tilejit's numbers.

Shapes: B*S = 16384, H*D = 2048, S in {1k, 2k, 4k, 8k, 16k}, D in {64, 128, 256}, causal and
not. TFLOP/s = 4*B*H*S^2*D / time (half for causal). Peers: PyTorch SDPA in bf16 with the
flash and the cuDNN backends (median of CUDA-event-timed launches after warm-up).

tilejit's rows come from `attn_proto --bench --csv FILE` (bench/attention/run.sh), which runs
the same device code the sm_90a attention lowering instantiates (and checks every config it
times against a float64 emulation). The merged table takes, per shape, the fastest passing
tilejit config of each input type.

usage: bench.py [--tilejit-csv FILE] [--out FILE.md] [--reps N] [--seq S] [--d D]
"""
import argparse
import csv
import math
import sys


def flops(B, H, S, D, causal):
    return 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)


def shapes(only_seq=0, only_d=0):
    for D in (64, 128, 256):
        for S in (1024, 2048, 4096, 8192, 16384):
            if (only_seq and S != only_seq) or (only_d and D != only_d):
                continue
            yield 16384 // S, 2048 // D, S, D


def time_ms(torch, fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def torch_peers(args):
    """{(S, D, causal): {peer: (ms, tflops)}}"""
    res = {}
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        print("torch: not available (%s); peers skipped" % e)
        return res, None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = [("sdpa_flash_bf16", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
                    ("sdpa_cudnn_bf16", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))]
    except Exception:  # noqa: BLE001  (torch < 2.3)
        backends = [("sdpa_flash_bf16", lambda: torch.backends.cuda.sdp_kernel(
            enable_flash=True, enable_math=False, enable_mem_efficient=False))]
    if not torch.cuda.is_available():
        print("torch: no CUDA device; peers skipped")
        return res, None
    dev = torch.cuda.get_device_name(0)
    print("torch %s, %s, cuDNN %s" % (torch.__version__, dev, torch.backends.cudnn.version()))
    for B, H, S, D in shapes(args.seq, args.d):
        torch.manual_seed(0)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn_like(q)
        v = torch.randn_like(q)
        for causal in (False, True):
            row = {}
            for name, be in backends:
                try:
                    with be():
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
                        ms = time_ms(torch, fn, args.reps)
                    row[name] = (ms, flops(B, H, S, D, causal) / (ms * 1e-3) / 1e12)
                except Exception as e:  # noqa: BLE001
                    row[name] = None
                    print("  %s S=%d D=%d causal=%d: unavailable (%s)" % (name, S, D, causal, str(e).splitlines()[0][:120]))
            res[(S, D, causal)] = row
            print("  S=%5d D=%3d causal=%d  %s" % (S, D, causal, "  ".join(
                "%s %.1f" % (n, r[1]) if r else "%s n/a" % n for n, r in row.items())))
        del q, k, v
        torch.cuda.empty_cache()
    return res, dev


def tilejit_rows(path):
    """{(S, D, causal): {"fp8": (tflops, config), "bf16": (tflops, config)}} best passing config."""
    best = {}
    if not path:
        return best
    try:
        f = open(path)
    except OSError as e:
        print("tilejit csv: %s" % e)
        return best
    for r in csv.DictReader(f):
        if r.get("pass") != "1":
            continue
        key = (int(r["S"]), int(r["D"]), int(r["causal"]) != 0)
        kind = "fp8" if r["impl"].endswith("fp8") else ("bf16" if r["impl"].endswith("bf16") else None)
        if kind is None or "outfp8" in r["config"]:
            continue
        tf = float(r["tflops"])
        cur = best.setdefault(key, {})
        if kind not in cur or tf > cur[kind][0]:
            cur[kind] = (tf, r["config"])
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tilejit-csv")
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--d", type=int, default=0)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    peers, dev = ({}, None) if args.no_torch else torch_peers(args)
    tj = tilejit_rows(args.tilejit_csv)
    lines = []
    lines.append("Attention forward, TFLOP/s = 4*B*H*S^2*D / time (half for causal); B*S = 16384, H*D = 2048; %s"
                 % (dev or "device: see attn_proto output"))
    lines.append("")
    lines.append("| D | S | causal | tilejit fp8 | tilejit bf16 | SDPA flash bf16 | SDPA cuDNN bf16 | fp8 / cuDNN | "
                 "fp8 / flash | bf16 / cuDNN | best fp8 config |")
    lines.append("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")

    def f(x):
        return "%.1f" % x if x else "n/a"

    def ratio(a, b):
        return "%.2f" % (a / b) if a and b else "n/a"

    for B, H, S, D in shapes(args.seq, args.d):
        for causal in (False, True):
            t = tj.get((S, D, causal), {})
            p = peers.get((S, D, causal), {})
            fp8 = t.get("fp8", (0, ""))[0]
            bf = t.get("bf16", (0, ""))[0]
            fl = (p.get("sdpa_flash_bf16") or (0, 0))[1]
            cu = (p.get("sdpa_cudnn_bf16") or (0, 0))[1]
            lines.append("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                D, S, "yes" if causal else "no", f(fp8), f(bf), f(fl), f(cu), ratio(fp8, cu), ratio(fp8, fl),
                ratio(bf, cu), t.get("fp8", (0, "-"))[1]))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as o:
            o.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
