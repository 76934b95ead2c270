#!/usr/bin/env python3
"""Times torch on the problems of bench_dsl and merges both JSON-lines files into one table.

  python3 bench/dsl/peers.py --out torch.jsonl [--problems FILE.jsonl] [--reps 20]
  python3 bench/dsl/peers.py --merge tilejit.jsonl torch.jsonl [--table table.md]

--problems: bench_dsl's output; the peers run on the problems listed there ("gemm nk M N K",
"gemm kn M N K", "bmm Z M N K", "swiglu M N K", "attention B H S D [causal]", "attention_bwd B H S D [causal]").
Method (as bench_dsl): inputs ~ N(0, 1) in bf16 (GEMM weights scaled by 1/sqrt(K)); each sample
is one call between two CUDA events after a 256 MB write that flushes the L2 cache, queued behind
torch.cuda._sleep; warm-up calls, then the median of --reps samples.
Peers: torch.matmul / torch.bmm (cuBLAS), the same with the epilogue in eager torch; SwiGLU as two
matmuls and one elementwise pass, eager and torch.compile; attention: SDPA with the cuDNN and the
flash backends (scale 1/sqrt(D)); attention_bwd: the backward of SDPA (cuDNN, flash) alone, by
autograd.grad on a saved forward.
"""
import argparse
import json
import math
import statistics
import sys


def time_call(fn, reps, warmup=3):
    import torch

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(int(2e7))
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def peers_for(problem):
    """[(name, flops, fn)] for one problem key."""
    import torch
    import torch.nn.functional as F

    dev, bf = "cuda", torch.bfloat16
    words = problem.split()
    out = []
    if words[0] == "gemm":
        kn = words[1] == "kn"
        m, n, k = (int(x) for x in words[2:5])
        a = torch.randn(m, k, device=dev).to(bf)
        b = (torch.randn(k, n, device=dev) / math.sqrt(k)).to(bf) if kn else (torch.randn(n, k, device=dev) / math.sqrt(k)).to(bf)
        bias = torch.randn(n, device=dev)
        bt = b if kn else b.t()
        flops = 2.0 * m * n * k
        out.append(("torch.matmul", flops, lambda: torch.matmul(a, bt)))
        out.append(("torch matmul+bias+gelu", flops,
                    lambda: F.gelu(torch.matmul(a, bt).float() + bias, approximate="tanh").to(bf)))
    elif words[0] == "bmm":
        z, m, n, k = (int(x) for x in words[1:5])
        a = torch.randn(z, m, k, device=dev).to(bf)
        b = torch.randn(z, n, k, device=dev).to(bf)
        out.append(("torch.bmm", 2.0 * z * m * n * k, lambda: torch.bmm(a, b.transpose(1, 2))))
    elif words[0] == "swiglu":
        m, n, k = (int(x) for x in words[1:4])
        x = torch.randn(m, k, device=dev).to(bf)
        wg = (torch.randn(n, k, device=dev) / math.sqrt(k)).to(bf)
        wu = (torch.randn(n, k, device=dev) / math.sqrt(k)).to(bf)

        def swiglu():
            return F.silu(x @ wg.t()) * (x @ wu.t())

        flops = 4.0 * m * n * k
        out.append(("torch 2 GEMMs + pass", flops, swiglu))
        try:
            compiled = torch.compile(swiglu)
            compiled()
            out.append(("torch.compile", flops, compiled))
        except Exception as e:  # noqa: BLE001 -- report and go on without it
            print(f"torch.compile failed for {problem}: {e}", file=sys.stderr)
    elif words[0] in ("sink", "mla"):
        # The nearest fast peer: SDPA on the same shapes without the sink (sink), with its own value
        # head dim (mla).
        b, h, s = (int(x) for x in words[1:4])
        dqk = int(words[4])
        dv = int(words[5]) if words[0] == "mla" else dqk
        q, k = (torch.randn(b, h, s, dqk, device=dev).to(bf) for _ in range(2))
        v = torch.randn(b, h, s, dv, device=dev).to(bf)
        flops = 2.0 * b * h * s * s * (dqk + dv)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v)
            try:
                run()
                out.append((name, flops, run))
            except Exception as e:  # noqa: BLE001
                print(f"{name} failed for {problem}: {e}", file=sys.stderr)
    elif words[0] == "window":
        # Causal sliding window (row i sees keys i - w + 1 .. i): flex_attention compiled with its
        # BlockMask (built here, outside the timing), and SDPA with the boolean mask.
        b, h, s, d, w = (int(x) for x in words[1:6])
        q, k, v = (torch.randn(b, h, s, d, device=dev).to(bf) for _ in range(3))
        flops = 4.0 * b * h * d * (w * s - w * (w - 1) / 2)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            def window_mask(b_, h_, q_idx, kv_idx):
                return (kv_idx <= q_idx) & (q_idx - kv_idx < w)
            bm = create_block_mask(window_mask, None, None, s, s, device=dev)
            flex = torch.compile(flex_attention, dynamic=False)

            def run_flex():
                return flex(q, k, v, block_mask=bm)
            run_flex()
            out.append(("flex_attention", flops, run_flex))
        except Exception as e:  # noqa: BLE001
            print(f"flex_attention failed for {problem}: {e}", file=sys.stderr)
        i = torch.arange(s, device=dev)
        mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < w)
        out.append(("SDPA bool mask", flops, lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
    elif words[0] == "attention":
        b, h, s, d = (int(x) for x in words[1:5])
        causal = len(words) > 5 and words[5] == "causal"
        q, k, v = (torch.randn(b, h, s, d, device=dev).to(bf) for _ in range(3))
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            try:
                run()
                out.append((name, flops, run))
            except Exception as e:  # noqa: BLE001
                print(f"{name} failed for {problem}: {e}", file=sys.stderr)
    elif words[0] == "attention_bwd":
        # The backward alone: autograd.grad through one saved SDPA forward per backend.
        b, h, s, d = (int(x) for x in words[1:5])
        causal = len(words) > 5 and words[5] == "causal"
        q, k, v = (torch.randn(b, h, s, d, device=dev).to(bf).requires_grad_() for _ in range(3))
        do = torch.randn(b, h, s, d, device=dev).to(bf)
        flops = 10.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def run(o=o):
                    return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                run()
                out.append((name, flops, run))
            except Exception as e:  # noqa: BLE001
                print(f"{name} failed for {problem}: {e}", file=sys.stderr)
    return out


def bench(args):
    import torch

    problems = []
    with open(args.problems) as f:
        for line in f:
            p = json.loads(line)["problem"]
            if p not in problems:
                problems.append(p)
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}; torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    with open(args.out, "w") as out:
        for problem in problems:
            for name, flops, fn in peers_for(problem):
                ms = time_call(fn, args.reps)
                rec = {"problem": problem, "impl": name, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
                print(f"{problem:40s} {name:26s} {ms:9.4f} ms {rec['tflops']:8.1f} TFLOP/s", flush=True)
                out.write(json.dumps(rec) + "\n")
            torch.cuda.empty_cache()


MAIN_PEER = {"gemm": "torch.matmul", "bmm": "torch.bmm", "swiglu": "torch 2 GEMMs + pass", "attention": "SDPA cuDNN",
             "sink": "SDPA cuDNN", "mla": "SDPA cuDNN", "attention_bwd": "SDPA cuDNN"}


def config_text(c):
    """A config as the table shows it: blocks, warps, stages, then knobs other than `lowering`."""
    text = json.dumps(c["blocks"]) + f" w{c.get('num_warps', 4)} s{c.get('num_stages', 2)}"
    return text + "".join(f" {k}={v}" for k, v in c.get("knobs", {}).items() if k != "lowering")


def merge(args):
    rows = {}
    order = []
    for path in args.merge:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                p = r["problem"]
                if p not in rows:
                    rows[p] = {}
                    order.append(p)
                impl = r["impl"]
                best = rows[p].get(impl)
                if best is None or r["tflops"] > best["tflops"]:
                    rows[p][impl] = r
    lines = ["| problem | tilejit generic | config | rel err | template | peers (TFLOP/s) | generic / main peer | generic / template |",
             "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: |"]
    for p in order:
        r = rows[p]
        generic = [v for k, v in r.items() if k.startswith("tilejit generic")]
        g = max(generic, key=lambda v: v["tflops"]) if generic else None
        t = r.get("tilejit template")
        peers = {k: v for k, v in r.items() if not k.startswith("tilejit")}
        main = peers.get(MAIN_PEER.get(p.split()[0], ""))
        cfg = config_text(g["config"]) if g else ""
        if g and "config_dq" in g:   # the backward: the dK / dV kernel's config, then the dQ kernel's
            cfg = f"dkdv {cfg}; dq {config_text(g['config_dq'])}"
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            p,
            f"{g['tflops']:.1f}" if g else "-",
            cfg.replace('"', ""),
            f"{g['rel_err']:.1e}" if g and g.get("rel_err") is not None else "-",
            f"{t['tflops']:.1f}" if t else "-",
            "; ".join(f"{k} {v['tflops']:.1f}" for k, v in peers.items()) or "-",
            f"**{g['tflops'] / main['tflops']:.2f}**" if g and main else "-",
            f"{g['tflops'] / t['tflops']:.2f}" if g and t else "-"))
    table = "\n".join(lines)
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--problems")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--merge", nargs="+")
    ap.add_argument("--table")
    args = ap.parse_args()
    if args.merge:
        merge(args)
    elif args.out and args.problems:
        bench(args)
    else:
        ap.error("give --out and --problems, or --merge")


if __name__ == "__main__":
    main()
