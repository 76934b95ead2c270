#!/usr/bin/env python3
"""Float64 emulation of FP8 attention-backward recipes (no kernel involved): which operands of
the backward's five products can be FP8, in which format and with which scales, and what that
costs in gradient accuracy. Issue 42's FP8 backward is to be built on the recipe this shows
best, and held to within 2x of its emulated error.

The backward emulated is the library's (kernels/attention_backward.cpp, FlashAttention-2's):
S = Q Kᵀ · scale, P = exp(S - lse) with the forward's LSE, dV = Pᵀ dO, dP = dO Vᵀ, delta =
rowsum(dO ∘ O), dS = P ∘ (dP - delta), dQ = dS K · scale, dK = dSᵀ Q · scale. Every product's
operands are rounded as a recipe says and the product is exact (float64), as the tensor cores'
f32 accumulation is to within much less than FP8's rounding. Per-tensor descales are amax /
fp8_max (448 for e4m3, 57344 for e5m2), as kernels/quantize.cpp computes them. P is in [0, 1]:
its FP8 copy is 2^8 P (the forward's exp2(s - (m - 8)) range), divided out of dV. dS has no
a-priori bound: "amax" scales it by its own amax (a pass the kernels cannot afford: the ideal),
"2^k" by a fixed power of two.

Prints, per input distribution, the relative RMS error of dQ, dK and dV against float64 of the
unquantized inputs.

Usage: python3 backward_emulation.py [--seq 1024] [--dim 128] [--seed 0]
"""
import argparse

import ml_dtypes
import numpy as np

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
DTYPES = {"e4m3": E4M3, "e5m2": E5M2}


def bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def fp8(x, fmt):
    """Round to e4m3 / e5m2 (nearest even, saturating)."""
    return np.clip(x, -FMAX[fmt], FMAX[fmt]).astype(DTYPES[fmt]).astype(np.float64)


def quantized(x, fmt, scale=None):
    """x as its fmt copy times the descale: one descale for the tensor (amax / fp8_max), or 1 /
    `scale` for a fixed scale."""
    if fmt == "bf16":
        return bf16(x)
    if scale is None:
        amax = np.abs(x).max()
        ds = amax / FMAX[fmt] if amax > 0 else 1.0
    else:
        ds = 1.0 / scale
    return fp8(x / ds, fmt) * ds


def exact(q, k, v, do, causal):
    """float64 forward (o, lse) and backward (dq, dk, dv)."""
    scale = 1.0 / np.sqrt(q.shape[1])
    s = q @ k.T * scale
    if causal:
        s = np.where(np.tril(np.ones_like(s, dtype=bool)), s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    lse = m + np.log(p.sum(axis=1, keepdims=True))
    p = np.exp(s - lse)
    o = p @ v
    dp = do @ v.T
    delta = (do * o).sum(axis=1, keepdims=True)
    ds = p * (dp - delta)
    return o, lse, ds @ k * scale, ds.T @ q * scale, p.T @ do


def recipe_backward(q, k, v, do, o, causal, r):
    """The backward with the recipe's roundings. r: dict with 'qkv', 'do', 'p', 'ds' formats and
    'ds_scale' (None: its own amax; a number: that fixed scale)."""
    scale = 1.0 / np.sqrt(q.shape[1])
    q8, k8, v8 = (quantized(t, r["qkv"]) for t in (q, k, v))
    do8 = quantized(do, r["do"])
    # The forward's LSE over the same quantized Q and K (what an FP8 forward saved).
    s = q8 @ k8.T * scale
    if causal:
        s = np.where(np.tril(np.ones_like(s, dtype=bool)), s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(s - m).sum(axis=1, keepdims=True))
    p = np.exp(s - lse)
    p8 = quantized(p, r["p"], scale=256.0) if r["p"] != "bf16" else bf16(p)
    dv = p8.T @ do8
    dp = do8 @ v8.T
    if r.get("delta") == "do8":
        # From the FP8 forward's O (P V over the quantized V, in bf16) and the quantized dO: the
        # dP the recipe computes sums to it over each row (sum_j P dP = dO8 . O), so dS's rows
        # sum to zero as the exact gradient's do (a row that sees one key gets dS = 0).
        delta = (do8 * bf16(p @ v8)).sum(axis=1, keepdims=True)
    else:
        delta = (do * o).sum(axis=1, keepdims=True)   # from the 16-bit O and dO, in f32
    ds = p * (dp - delta)
    ds8 = quantized(ds, r["ds"], scale=r.get("ds_scale")) if r["ds"] != "bf16" else bf16(ds)
    return ds8 @ k8 * scale, ds8.T @ q8 * scale, dv


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


RECIPES = [
    ("bf16 (the 16-bit backward)", dict(qkv="bf16", do="bf16", p="bf16", ds="bf16")),
    ("e4m3 Q K V, bf16 dO, P, dS", dict(qkv="e4m3", do="bf16", p="bf16", ds="bf16")),
    ("e4m3 Q K V dO, e4m3 P, bf16 dS", dict(qkv="e4m3", do="e4m3", p="e4m3", ds="bf16")),
    ("e4m3 Q K V, e5m2 dO, e4m3 P, bf16 dS", dict(qkv="e4m3", do="e5m2", p="e4m3", ds="bf16")),
    ("e4m3 all, dS by its amax", dict(qkv="e4m3", do="e4m3", p="e4m3", ds="e4m3", ds_scale=None)),
    ("e4m3 Q K V P, e5m2 dO dS, dS by its amax", dict(qkv="e4m3", do="e5m2", p="e4m3", ds="e5m2", ds_scale=None)),
    ("e4m3 Q K V P, e5m2 dO dS, dS x 2^8", dict(qkv="e4m3", do="e5m2", p="e4m3", ds="e5m2", ds_scale=256.0)),
    ("e4m3 Q K V P, e5m2 dO dS, dS x 2^12", dict(qkv="e4m3", do="e5m2", p="e4m3", ds="e5m2", ds_scale=4096.0)),
    ("e4m3 Q K V P dO, e5m2 dS x 2^12", dict(qkv="e4m3", do="e4m3", p="e4m3", ds="e5m2", ds_scale=4096.0)),
    ("e4m3 Q K V P dO, e5m2 dS x 2^8", dict(qkv="e4m3", do="e4m3", p="e4m3", ds="e5m2", ds_scale=256.0)),
    ("e4m3 Q K V P dO, e5m2 dS x 2^12, delta from e4m3 dO", dict(qkv="e4m3", do="e4m3", p="e4m3", ds="e5m2", ds_scale=4096.0,
                                                                delta="do8")),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    S, D = a.seq, a.dim
    dists = {
        "N(0, 1)": lambda: rng.standard_normal((S, D)),
        "N(0, 1) + N(0, 100) * Bernoulli(0.001)": lambda: rng.standard_normal((S, D))
        + rng.standard_normal((S, D)) * 10.0 * (rng.random((S, D)) < 0.001),
    }
    print(f"S {S}, D {D}, one head; rel RMSE of dQ / dK / dV against float64 of the unquantized inputs "
          f"(Q, K, V, dO rounded to bf16 first, as the kernels get them)\n")
    for name, gen in dists.items():
        for causal in (False, True):
            q, k, v = bf16(gen()), bf16(gen()), bf16(gen())
            do = bf16(rng.standard_normal((S, D)))
            o, _, dq, dk, dv = exact(q, k, v, do, causal)
            o16 = bf16(o)
            print(f"{name}, {'causal' if causal else 'non-causal'}:")
            print("| recipe | dQ | dK | dV |")
            print("| --- | ---: | ---: | ---: |")
            for label, r in RECIPES:
                gq, gk, gv = recipe_backward(q, k, v, do, o16, causal, r)
                print(f"| {label} | {rel(gq, dq):.2e} | {rel(gk, dk):.2e} | {rel(gv, dv):.2e} |")
            print()


if __name__ == "__main__":
    main()
