"""The peers of bench_linear (the FP8 linear layer): seed 001's FP8Linear on torch._scaled_mm
(x and w to e4m3 and the output's gradient to e5m2, one dynamic scale per tensor: amax / fp8
max; dx = dy w and dw = dyᵀ x as _scaled_mm of a row-major A and a column-major B, the
transposed copies made contiguous as cuBLASLt needs), and the bf16 linear layer (x wᵀ, dy w,
dyᵀ x as torch.matmul). Timed as bench_linear times tilejit: each sample between two CUDA events
behind a spin (torch.cuda._sleep), median of --reps after --warmup, no L2 flush; rel err against
float64 at 8 sampled rows. JSON lines on stdout (or --out).

    python3 bench/gemm/linear_peer.py [--sizes 4096,8192] [--reps 20] [--warmup 3] [--out FILE.jsonl]
"""
import argparse
import json
import statistics
import sys

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FMAX = {E4M3: 448.0, E5M2: 57344.0}


def quantize(t, dtype):
    """t / scale in fp8 (saturating) and the scale (f32 scalar tensor): amax / fp8 max."""
    amax = t.abs().amax().float()
    scale = torch.where(amax > 0, amax / FMAX[dtype], torch.ones_like(amax))
    q = (t.float() / scale).clamp(-FMAX[dtype], FMAX[dtype]).to(dtype)
    return q, scale


def fp8_forward(x, w):
    xq, sx = quantize(x, E4M3)
    wq, sw = quantize(w, E4M3)
    return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)


def fp8_backward(dy, x, w):
    dyq, sdy = quantize(dy, E5M2)
    wq, sw = quantize(w, E4M3)
    xq, sx = quantize(x, E4M3)
    # dx [M, K] = dy [M, N] · w [N, K]: B = w as a column-major [N, K] (wᵀ contiguous)
    dx = torch._scaled_mm(dyq, wq.t().contiguous().t(), scale_a=sdy, scale_b=sw, out_dtype=torch.bfloat16)
    # dw [N, K] = dyᵀ [N, M] · x [M, K]: A = dyᵀ row-major, B = x column-major
    dw = torch._scaled_mm(dyq.t().contiguous(), xq.t().contiguous().t(), scale_a=sdy, scale_b=sx, out_dtype=torch.float32)
    return dx, dw


def bf16_forward(x, w):
    return x @ w.t()


def bf16_backward(dy, x, w):
    return dy @ w, (dy.t() @ x).float()


def time_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(40_000_000)   # about 20 ms at boost clock: the host queues the samples meanwhile
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def sampled_error(got, exact_row, rows):
    se = sr = 0.0
    for s in range(8):
        i = (s * 2654435761) % rows
        e = exact_row(i)
        g = got[i].double()
        se += ((g - e) ** 2).sum().item()
        sr += (e ** 2).sum().item()
    return (se / max(sr, 1e-300)) ** 0.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    out = open(a.out, "w") if a.out else sys.stdout
    gen = torch.Generator(device="cuda").manual_seed(2026)
    for S in [int(s) for s in a.sizes.split(",")]:
        M = N = K = S
        x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
        w = (torch.randn(N, K, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        dy = (torch.randn(M, N, generator=gen, device="cuda") * 1e-3).to(torch.bfloat16)
        xd, wd, dyd = x.double(), w.double(), dy.double()
        for impl, fwd, bwd in [("torch._scaled_mm FP8Linear", fp8_forward, fp8_backward), ("torch bf16 linear", bf16_forward, bf16_backward)]:
            f = time_ms(lambda: fwd(x, w), a.reps, a.warmup)
            b = time_ms(lambda: bwd(dy, x, w), a.reps, a.warmup)
            fb = time_ms(lambda: (fwd(x, w), bwd(dy, x, w)), a.reps, a.warmup)
            y = fwd(x, w)
            dx, dw = bwd(dy, x, w)
            ey = sampled_error(y, lambda i: xd[i] @ wd.t(), M)
            edx = sampled_error(dx, lambda i: dyd[i] @ wd, M)
            edw = sampled_error(dw, lambda i: dyd[:, i] @ xd, N)
            rec = {"impl": impl, "scaling": "dynamic" if "FP8" in impl else "-", "size": S, "forward_ms": round(f, 4),
                   "backward_ms": round(b, 4), "both_ms": round(fb, 4), "tflops": round(6.0 * M * N * K / (fb * 1e-3) / 1e12, 1),
                   "err_y": ey, "err_dx": edx, "err_dw": edw}
            print(json.dumps(rec), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
