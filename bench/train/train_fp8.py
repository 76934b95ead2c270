#!/usr/bin/env python3
"""A small GPT trained 200 steps in FP8 and in bf16 from the same seed (issue 42's training bar:
the loss curves within 1% at the end).

FP8: every block's linear layer is tilejit.fp8_linear (e4m3 x and w, e5m2 gradients, dynamic
scaling) and the attention is tilejit.attention(fp8=True) with its FP8 backward. bf16: the same
model on torch's F.linear and F.scaled_dot_product_attention. Both: fp32 master weights, bf16
compute, the embedding, LayerNorms and the output head in bf16 torch (the usual FP8 recipe keeps
the first and last layers in 16 bits), AdamW, the same initial weights and the same batches.

Data: a synthetic language with structure for both halves of the model: each sequence is 512
tokens of a fixed sparse Markov chain (each token has 16 successors with Zipf weights: the MLPs'
bigram table) followed by the same 512 tokens again (the attention's copy task).

Usage: python3 train_fp8.py [--steps 200] [--out losses.json]; then plot_loss.py losses.json out.png
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tilejit

V, D_MODEL, HEADS, LAYERS, SEQ, BATCH, MLP = 2048, 512, 4, 4, 1024, 8, 2048
HALF = SEQ // 2


def markov_table(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    succ = torch.randint(0, V, (V, 16), generator=g, device="cuda")
    w = 1.0 / torch.arange(1, 17, device="cuda", dtype=torch.float32)
    return succ, w / w.sum()


def batch(step, succ, probs):
    """[BATCH, SEQ + 1] tokens: a Markov half, then that half again."""
    g = torch.Generator(device="cuda").manual_seed(1000 + step)
    first = torch.empty(BATCH, HALF + 1, dtype=torch.long, device="cuda")
    first[:, 0] = torch.randint(0, V, (BATCH,), generator=g, device="cuda")
    choice = torch.multinomial(probs.expand(BATCH * HALF, 16), 1, generator=g).view(BATCH, HALF)
    for t in range(HALF):
        first[:, t + 1] = succ[first[:, t], choice[:, t]]
    half = first[:, :HALF]
    return torch.cat([half, half, half[:, :1]], dim=1)


class Linear(nn.Module):
    def __init__(self, d_in, d_out, fp8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) * d_in ** -0.5)
        self.bias = nn.Parameter(torch.zeros(d_out))
        self.fp8 = fp8

    def forward(self, x):
        w, b = self.weight.to(torch.bfloat16), self.bias.to(torch.bfloat16)
        return tilejit.fp8_linear(x, w, b) if self.fp8 else F.linear(x, w, b)


class Block(nn.Module):
    def __init__(self, fp8):
        super().__init__()
        self.fp8 = fp8
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv, self.out = Linear(D_MODEL, 3 * D_MODEL, fp8), Linear(D_MODEL, D_MODEL, fp8)
        self.up, self.down = Linear(D_MODEL, MLP, fp8), Linear(MLP, D_MODEL, fp8)

    def forward(self, x):
        B, S, _ = x.shape
        h = F.layer_norm(x, (D_MODEL,), self.ln1.weight.to(x.dtype), self.ln1.bias.to(x.dtype))
        q, k, v = self.qkv(h).view(B, S, 3, HEADS, D_MODEL // HEADS).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))   # [B, H, S, D] views of [B, S, H, D] storage
        if self.fp8:
            o = tilejit.attention(q, k, v, causal=True, fp8=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(o.transpose(1, 2).reshape(B, S, D_MODEL))
        h = F.layer_norm(x, (D_MODEL,), self.ln2.weight.to(x.dtype), self.ln2.bias.to(x.dtype))
        return x + self.down(F.gelu(self.up(h)))


class GPT(nn.Module):
    def __init__(self, fp8):
        super().__init__()
        self.emb = nn.Embedding(V, D_MODEL)
        self.pos = nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.blocks = nn.ModuleList(Block(fp8) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Parameter(torch.randn(V, D_MODEL) * D_MODEL ** -0.5)

    def forward(self, tokens):
        x = (self.emb(tokens) + self.pos[: tokens.shape[1]]).to(torch.bfloat16)
        for b in self.blocks:
            x = b(x)
        x = F.layer_norm(x, (D_MODEL,), self.ln.weight.to(x.dtype), self.ln.bias.to(x.dtype))
        return F.linear(x, self.head.to(torch.bfloat16)).float()


def train(fp8, steps, succ, probs):
    torch.manual_seed(0)
    model = GPT(fp8).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 20
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    losses, times = [], []
    for step in range(steps):
        tokens = batch(step, succ, probs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            print(f"{'fp8 ' if fp8 else 'bf16'} step {step:4d} loss {losses[-1]:.4f} ({times[-1]:.1f} ms)", flush=True)
    return losses, statistics.median(times[steps // 2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default="losses.json")
    a = ap.parse_args()
    succ, probs = markov_table(7)
    result = {"model": f"GPT {LAYERS} blocks, d {D_MODEL}, {HEADS} heads of {D_MODEL // HEADS}, MLP {MLP}, vocab {V}, "
                       f"seq {SEQ} (512 Markov tokens, then repeated), batch {BATCH}",
              "device": torch.cuda.get_device_name(), "steps": a.steps}
    for fp8 in (False, True):
        losses, ms = train(fp8, a.steps, succ, probs)
        result["fp8" if fp8 else "bf16"] = {"loss": losses, "ms_per_step": ms}
    end = {k: statistics.mean(result[k]["loss"][-10:]) for k in ("bf16", "fp8")}
    result["final_mean10"] = end
    result["final_gap"] = abs(end["fp8"] - end["bf16"]) / end["bf16"]
    print(f"final loss (mean of the last 10 steps): bf16 {end['bf16']:.4f}, fp8 {end['fp8']:.4f}, gap "
          f"{100 * result['final_gap']:.2f}% (bar: 1%); ms/step bf16 {result['bf16']['ms_per_step']:.1f}, "
          f"fp8 {result['fp8']['ms_per_step']:.1f}")
    with open(a.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
