#!/usr/bin/env python3
"""Plots train_fp8.py's loss curves (FP8 and bf16) into a PNG.

Usage: python3 plot_loss.py losses.json loss.png   (needs matplotlib)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = json.load(open(src))
    fig, (ax, gap) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for key, label in (("bf16", "bf16 (torch F.linear, SDPA)"), ("fp8", "FP8 (tilejit fp8_linear, attention fp8=True)")):
        ax.plot(r[key]["loss"], label=f"{label}: {r[key]['ms_per_step']:.1f} ms/step")
    ax.set_ylabel("training loss")
    ax.set_title(f"{r['model']}\n{r['device']}, {r['steps']} steps, same seed", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    rel = [100 * (f - b) / b for f, b in zip(r["fp8"]["loss"], r["bf16"]["loss"])]
    gap.plot(rel, color="gray")
    gap.axhline(0, color="black", lw=0.5)
    gap.set_ylabel("FP8 - bf16 (%)")
    gap.set_xlabel("step")
    gap.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main()
