#!/usr/bin/env python3
"""PyTorch peers of `tilejit bench memory` (tools/bench_memory.cpp): each op eager and under
torch.compile on the same shapes, bf16, timed as tilejit times (CUDA events, L2 flushed before
each launch, the median), checked against float64 on sampled rows. Writes a CSV (op, peer, ms, ok,
note) that the bench merges into its table; '#' lines are notes.

  python3 bench/memory/peers.py --rows 16384 --cols 4096 --csv out.csv
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--csv", required=True)
    a = ap.parse_args()
    out = open(a.csv, "w")
    out.write("op,peer,ms,ok,note\n")
    try:
        import torch
    except Exception as e:  # no torch here: say so, write no rows
        out.write(f"# torch could not be imported: {e}\n")
        return 0
    if not torch.cuda.is_available():
        out.write("# torch sees no GPU\n")
        return 0
    dev = "cuda"
    R, C = a.rows, a.cols
    n = R * C
    S, D = 4096, 128
    heads = n // (S * D)
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(R, C, device=dev, dtype=torch.bfloat16, generator=g)
    y = torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn(C, device=dev, dtype=torch.bfloat16, generator=g)
    b = torch.randn(C, device=dev, dtype=torch.bfloat16, generator=g)
    flush = torch.empty(max(4 * torch.cuda.get_device_properties(0).L2_cache_size, 256 << 20), dtype=torch.uint8, device=dev)

    def timed(fn):
        for _ in range(a.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(a.reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(a.reps)]
        for i in range(a.reps):
            flush.zero_()
            starts[i].record()
            fn()
            stops[i].record()
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
        return ms[len(ms) // 2]

    def quantize(t):  # per-head amax -> descale, e4m3 values (the pipeline's quantizer)
        h = t.view(heads, S * D)
        amax = h.abs().amax(dim=1, keepdim=True).float()
        ds = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        return (h.float() / ds).to(torch.float8_e4m3fn), ds

    def quantize_t(t):  # the same, writing each head's transpose [D, S]
        q, ds = quantize(t)
        return q.view(heads, S, D).transpose(1, 2).contiguous(), ds

    # Delayed scaling: the descale from an earlier amax (here this x's), this x's per-head amax
    # for the next call; values past the earlier amax saturate.
    prev_ds = quantize(x)[1]

    def quantize_delayed(t):
        h = t.view(heads, S * D)
        amax = h.abs().amax(dim=1, keepdim=True).float()
        return (h.float() / prev_ds).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), prev_ds, amax

    def quantize_t_delayed(t):
        q, ds, amax = quantize_delayed(t)
        return q.view(heads, S, D).transpose(1, 2).contiguous(), ds, amax

    ops = {
        "softmax": lambda: torch.softmax(x, -1),
        "rmsnorm": lambda: torch.nn.functional.rms_norm(x, (C,), w, 1e-5),
        "layernorm": lambda: torch.nn.functional.layer_norm(x, (C,), w, b, 1e-5),
        "add": lambda: x.view(-1) + y,
        "quantize": lambda: quantize(x),
        "quantize_t": lambda: quantize_t(x),
        "quantize_delayed": lambda: quantize_delayed(x),
        "quantize_t_delayed": lambda: quantize_t_delayed(x),
    }
    rows = torch.linspace(0, R - 1, 16, device=dev).long()
    xd = x[rows].double()

    def check(op, got):
        if op == "softmax":
            want = torch.softmax(xd, -1)
            return ((got[rows].double() - want).abs() / want.abs().clamp_min(1.0 / C)).max().item()
        if op in ("rmsnorm", "layernorm"):
            mean = xd.mean(-1, keepdim=True) if op == "layernorm" else 0.0
            d = xd - mean
            want = d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5) * w.double() + (b.double() if op == "layernorm" else 0.0)
            return ((got[rows].double() - want).abs() / want.abs().clamp_min(1.0)).max().item()
        if op == "add":
            want = x.view(-1).double() + y.double()
            return ((got.double() - want).abs() / want.abs().clamp_min(1.0)).max().item()
        q, ds = got[0], got[1]
        if op in ("quantize_t", "quantize_t_delayed"):
            q = q.transpose(1, 2).reshape(heads, S * D)
        deq = q.float().double() * ds.double()
        want = x.view(heads, S * D).double()
        return ((deq - want).abs() / torch.maximum(want.abs(), 16 * ds.double())).max().item()

    tol = {"quantize": 0.07, "quantize_t": 0.07, "quantize_delayed": 0.07, "quantize_t_delayed": 0.07}
    for op, fn in ops.items():
        for peer, f in (("torch_eager", fn), ("torch_compile", None)):
            try:
                if f is None:
                    f = torch.compile(fn)
                err = check(op, f())
                ms = timed(f)
                ok = err <= tol.get(op, 1.6e-2)
                out.write(f"{op},{peer},{ms:.5f},{int(ok)},max rel err {err:.1e}\n")
                print(f"{op:<11} {peer:<14} {ms:8.4f} ms  max rel err {err:.1e}", flush=True)
            except Exception as e:  # one peer failing leaves the others
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                out.write(f"# {op} {peer}: {msg}\n")
                print(f"{op} {peer}: {msg}", file=sys.stderr, flush=True)
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
