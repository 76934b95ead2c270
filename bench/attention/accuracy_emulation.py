#!/usr/bin/env python3
"""Float64 emulation of the FP8 attention quantization schemes (no kernel involved).

Prints, per input distribution, the relative RMSE, RMSE and cosine similarity of the output of
each scheme against float64 attention of the unquantized inputs, for the record in
bench/RESULTS.md and the accuracy targets of kernels/attention_fp8.h.

Every scheme emulates what the kernels do (kernels/quantize.cpp, kernels/attention_fp8.cpp):
  - per-(b, h) descale = amax / 448, x8 = e4m3(x / descale) (round to nearest, saturating);
  - P = exp2(s - (m - 8)) in [0, 256] quantized to e4m3, the row sum l of that quantized P, as
    the fp8 kernels without an LSE sum it (with an LSE: the unquantized P);
  - V quantized per (b, h) like Q and K.
Options on Q and K:
  - "hadamard": Q and K rotated by the orthonormal Sylvester Hadamard H (QH (KH)^T = Q K^T,
    so softmax is unchanged); outliers spread over the whole row before quantization;
  - "blocks": a scale per block of 128 rows instead of one per (b, h);
  - "q_residual p": Q ~ Q_hi + Q_lo with Q_hi = e4m3(Q/s), Q_lo' = e4m3(2^p (Q/s - Q_hi)),
    K' = e4m3(K8 * 2^-p); scores = s_q s_k ([Q_hi | Q_lo'] . [K8 | K']^T), an attention with
    a QK head dim of 2D;
  - "residual own scale": the low part with its own amax scale (not expressible with one
    descale per (b, h) for qq; shown as the bound the power-of-two shift tries to reach).

Usage: python3 accuracy_emulation.py [--seq 2048] [--dim 128] [--heads 1] [--seed 0]
"""
import argparse

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
FP8_MAX = 448.0
BLOCK_ROWS = 128
P_OFFSET = 256.0  # 2^8: P = exp2(s - (m - 8)) lies in [0, 256]


def e4m3(x):
    """Round to e4m3 (nearest even, saturating to +-448, as cvt.rn.satfinite)."""
    return np.clip(x, -FP8_MAX, FP8_MAX).astype(E4M3).astype(np.float64)


def descale_of(x):
    amax = np.abs(x).max()
    return amax / FP8_MAX if amax > 0 else 1.0


def quantize(x, blocks=False):
    """(x8, descale per row): x ~ x8 * descale, one descale per (b, h) or per block of rows."""
    ds = np.empty(x.shape[0])
    step = BLOCK_ROWS if blocks else x.shape[0]
    for r in range(0, x.shape[0], step):
        ds[r:r + step] = descale_of(x[r:r + step])
    return e4m3(x / ds[:, None]), ds


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def attention(scores, v, quantize_p):
    """Softmax(scores) v with the kernel's P quantization; scores already scaled."""
    m = scores.max(1, keepdims=True)
    p = np.exp(scores - m)
    if quantize_p:
        p = e4m3(p * P_OFFSET) / P_OFFSET
    l = p.sum(1, keepdims=True)  # the P that multiplies V: its weights sum to 1
    return (p @ v) / l


def scheme_output(q, k, v, rotate=False, blocks=False, residual=None):
    """O of one scheme. residual: None, an int p (power-of-two shift), or 'own' (own scale)."""
    d = q.shape[1]
    if rotate:
        h = hadamard(d)
        q, k = q @ h, k @ h
    q8, qd = quantize(q, blocks)
    k8, kd = quantize(k, blocks)
    v8, vd = quantize(v)
    qk = q8 @ k8.T
    if residual == "own":
        lo = q / qd[:, None] - q8
        lo8, lod = quantize(lo)
        qk = qk + (lo8 * lod[:, None]) @ k8.T
    elif residual is not None:
        shift = 2.0 ** residual
        q_lo = e4m3((q / qd[:, None] - q8) * shift)
        k_lo = e4m3(k8 / shift)
        qk = qk + q_lo @ k_lo.T
    scores = qk * qd[:, None] * kd[None, :] / np.sqrt(d)
    return attention(scores, v8 * vd[:, None], quantize_p=True)


def k_shift_exactness(k, p, rotate):
    """Fraction of e4m3(K8 * 2^-p) entries that differ from K8 * 2^-p (e4m3 subnormals)."""
    if rotate:
        k = k @ hadamard(k.shape[1])
    k8, _ = quantize(k)
    return np.mean(e4m3(k8 / 2.0 ** p) != k8 / 2.0 ** p)


def q_reconstruction_error(q, p):
    """Relative RMSE of Q_hi (+ Q_lo' * 2^-p) against Q / descale: how exact the residual makes Q."""
    q8, qd = quantize(q)
    x = q / qd[:, None]
    lo = e4m3((x - q8) * 2.0 ** p) / 2.0 ** p
    rel = lambda y: np.sqrt(((y - x) ** 2).sum() / (x ** 2).sum())
    return rel(q8), rel(q8 + lo)


def inputs(rng, dist, s, d):
    x = rng.standard_normal((s, d))
    if dist == "outliers":
        x += rng.normal(0.0, 10.0, (s, d)) * (rng.random((s, d)) < 0.001)
    return x


SCHEMES = [
    ("Q, K only (per (b,h))", None),  # special: only Q and K quantized
    ("plain", dict()),
    ("plain, 128-row Q/K blocks", dict(blocks=True)),
    ("hadamard", dict(rotate=True)),
    ("hadamard, 128-row Q/K blocks", dict(rotate=True, blocks=True)),
    ("q_residual p=0 (same scale)", dict(residual=0)),
    ("q_residual p=2", dict(residual=2)),
    ("q_residual p=4", dict(residual=4)),
    ("q_residual, low part own scale", dict(residual="own")),
    ("hadamard + q_residual p=0", dict(rotate=True, residual=0)),
    ("hadamard + q_residual p=2", dict(rotate=True, residual=2)),
    ("hadamard + q_residual p=4", dict(rotate=True, residual=4)),
    ("hadamard + q_residual, 128-row blocks p=4", dict(rotate=True, blocks=True, residual=4)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=1, help="independent (b, h) slices, errors pooled")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    s, d = args.seq, args.dim
    print(f"S = {s}, D = {d}, heads = {args.heads}, seed = {args.seed}; errors against float64 of the unquantized inputs\n")
    for dist in ["N(0,1)", "outliers"]:
        err = {name: [0.0, 0.0, 0.0, 0.0] for name, _ in SCHEMES}  # sum e^2, sum r^2, sum o.r, sum o^2
        exact = {p: [] for p in (0, 2, 4)}
        recon = {p: [] for p in (0, 2, 4)}
        for _ in range(args.heads):
            q, k, v = (inputs(rng, dist, s, d) for _ in range(3))
            ref = attention(q @ k.T / np.sqrt(d), v, quantize_p=False)
            for name, opts in SCHEMES:
                if opts is None:
                    q8, qd = quantize(q)
                    k8, kd = quantize(k)
                    o = attention((q8 * qd[:, None]) @ (k8 * kd[:, None]).T / np.sqrt(d), v, quantize_p=False)
                else:
                    o = scheme_output(q, k, v, **opts)
                acc = err[name]
                acc[0] += ((o - ref) ** 2).sum()
                acc[1] += (ref ** 2).sum()
                acc[2] += (o * ref).sum()
                acc[3] += (o ** 2).sum()
            for p in exact:
                exact[p].append((k_shift_exactness(k, p, False), k_shift_exactness(k, p, True)))
                recon[p].append(q_reconstruction_error(q, p))
        n = args.heads * s * d
        print(f"{dist}:")
        print("| scheme | rel RMSE | RMSE | cosine |")
        print("| --- | ---: | ---: | ---: |")
        for name, _ in SCHEMES:
            se, sr, sor, so = err[name]
            print(f"| {name} | {np.sqrt(se / sr):.3e} | {np.sqrt(se / n):.3e} | {sor / np.sqrt(so * sr):.6f} |")
        for p, fr in exact.items():
            fr = np.array(fr).mean(0)
            print(f"K' = e4m3(K8 * 2^-{p}) inexact entries: {fr[0]:.2e} (no rotation), {fr[1]:.2e} (hadamard)")
        for p, r in recon.items():
            r = np.array(r).mean(0)
            print(f"Q relative error: Q_hi alone {r[0]:.2e}, Q_hi + Q_lo (p={p}) {r[1]:.2e}")
        print()


if __name__ == "__main__":
    main()
