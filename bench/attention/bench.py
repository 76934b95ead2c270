#!/usr/bin/env python3
"""Attention forward peers on the issue's shapes, merged with tilejit's numbers.

Shapes: B*S = 16384, H*D = 2048, S in {1k, 2k, 4k, 8k, 16k}, D in {64, 128, 256}, causal and
not. TFLOP/s = 4*B*H*S^2*D / time (half for causal). Peers: PyTorch SDPA in bf16 with the
flash and the cuDNN backends, run and timed by peers.py (median of CUDA-event-timed launches
after warm-up, L2 flushed before each).

This merges the attn_proto harness's CSV (bench/attention/run.sh). The DSL path's own benchmark,
with a Triton FP8 peer too, is `tilejit bench attention` (README.md).

tilejit's rows come from `attn_proto --bench --csv FILE` (bench/attention/run.sh), which runs
the same device code the sm_90a attention lowering instantiates (and checks every config it
times against a float64 emulation). The merged table takes, per shape, the fastest passing
tilejit config of each input type.

usage: bench.py [--tilejit-csv FILE] [--out FILE.md] [--reps N] [--seq S] [--d D]
"""
import argparse
import csv
import os
import sys


def shapes(only_seq=0, only_d=0):
    for D in (64, 128, 256):
        for S in (1024, 2048, 4096, 8192, 16384):
            if (only_seq and S != only_seq) or (only_d and D != only_d):
                continue
            yield 16384 // S, 2048 // D, S, D


def torch_peers(args):
    """{(S, D, causal): {peer: (ms, tflops)}}: PyTorch SDPA bf16 (flash, cuDNN) through peers.py,
    which times them like `tilejit bench attention` does (L2 flushed, median)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import peers
    pargs = argparse.Namespace(shapes=None, seq=args.seq, head_dim=args.d, causal=False, non_causal=False, quick=False,
                               reps=args.reps, warmup=3, seed=20261122, csv=None, only="sdpa_flash_bf16,sdpa_cudnn_bf16",
                               verbose=False)
    res = peers.run(pargs)
    out = {}
    for (B, H, S, D, causal), peer, ms, tf, rr, ok, note in res.rows:
        out.setdefault((S, D, causal), {})[peer] = (ms, tf)
    dev = None
    for n in res.notes:
        if n.startswith("peers: torch ") and ", " in n:   # "peers: torch 2.11.0, NVIDIA H200, cuDNN ..."
            parts = n.split(", ")
            dev = parts[1] if len(parts) > 1 else None
    return out, dev


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
