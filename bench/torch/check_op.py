"""torch.ops.tilejit.attention on the GPU: accuracy against SDPA (float32 math on the same
bf16 inputs) over layouts and grouped-query heads, inside a torch.compile'd module, and its
per-call cost over the C++ launch (tilejit::_launch_microseconds). Prints a markdown table;
exits 1 if a check fails.

    PYTHONPATH=python python bench/torch/check_op.py [--out FILE.md]
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tilejit


def rel_rmse(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def reference(q, k, v, causal):
    # float32 SDPA (math backend) on the same bf16 values; k / v repeated for grouped-query heads
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)


def variant_reference(q, k, v, variant, arg, causal):
    """float32 attention with tilejit's variant meaning (kernels/attention_variants.h; sliding_window
    is causal, i - j < arg; softcap arg * tanh(s / arg); alibi + 2^(-8 (h + 1) / H) (j - i))."""
    S, D, H = q.shape[2], q.shape[3], q.shape[1]
    s = (q @ k.transpose(-1, -2)) / D ** 0.5
    i = torch.arange(S, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    keep = (j <= i) if causal or variant == "sliding_window" else torch.ones(S, S, dtype=torch.bool, device=q.device)
    if variant == "sliding_window":
        keep = keep & (i - j < arg)
    elif variant == "softcap":
        s = arg * torch.tanh(s / arg)
    elif variant == "alibi":
        slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=q.device, dtype=torch.float32) / H)
        s = s + slopes[None, :, None, None] * (j - i).float()
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def inputs(layout, B, H, Hkv, S, D, gen):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)

    if layout == "BHSD":
        return rnd(B, H, S, D), rnd(B, Hkv, S, D), rnd(B, Hkv, S, D)
    if layout == "BSHD":   # Hugging Face / FlashAttention storage, passed as [B, H, S, D] views
        return rnd(B, S, H, D).transpose(1, 2), rnd(B, S, Hkv, D).transpose(1, 2), rnd(B, S, Hkv, D).transpose(1, 2)
    qkv = rnd(B, S, 3, H, D)   # packed
    return qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)


class Lines(list):
    """The report's lines, each printed as it is added (a failure later leaves what ran)."""

    def __init__(self, first):
        super().__init__()
        self.extend(first)

    def append(self, line):
        print(line, flush=True)
        super().append(line)

    def extend(self, lines):
        for line in lines:
            self.append(line)

    def __iadd__(self, lines):
        self.extend(lines)
        return self


class Block(torch.nn.Module):
    """An attention block as models write it, with tilejit's SDPA drop-in."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.d, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x, sdpa):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = q.view(B, S, self.h, self.d).transpose(1, 2)
        k = k.view(B, S, self.hkv, self.d).transpose(1, 2)
        v = v.view(B, S, self.hkv, self.d).transpose(1, 2)
        o = sdpa(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(o.transpose(1, 2).reshape(B, S, -1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(43)
    rows, ok = [], True
    dev = torch.cuda.get_device_name()
    lines = Lines([f"torch.ops.tilejit.attention on {dev}, torch {torch.__version__}", ""])

    # 1. accuracy over layouts, grouped-query heads, causal, bf16 and fp8
    lines += ["| layout | H / Hkv | causal | fp8 | rel RMSE vs float32 SDPA | limit | |", "| --- | --- | --- | --- | ---: | ---: | --- |"]
    for layout, H, Hkv in [("BHSD", 16, 16), ("BSHD", 16, 16), ("packed", 16, 16), ("BHSD", 16, 4), ("BSHD", 16, 2)]:
        for causal in (False, True):
            for fp8 in (False, True):
                q, k, v = inputs(layout, 2, H, Hkv, 1000, 128, gen)
                o = torch.ops.tilejit.attention(q, k, v, causal=causal, fp8=fp8)
                err = rel_rmse(o, reference(q, k, v, causal))
                limit = 6e-2 if fp8 else 1e-2
                good = err <= limit and torch.isfinite(o).all().item() and o.stride() == (q.stride() if layout != "packed" else o.stride())
                good &= torch.equal(o, tilejit.attention(q, k, v, causal=causal, fp8=fp8))   # the same call
                ok &= good
                lines.append(f"| {layout} | {H} / {Hkv} | {causal} | {fp8} | {err:.2e} | {limit:.0e} | {'ok' if good else 'FAIL'} |")

    # 1b. autograd: dq, dk, dv against float32 SDPA's (math backend) on the same bf16 values
    lines += ["", "| layout | H / Hkv | causal | fp8 | dout | rel RMSE dq / dk / dv vs float32 SDPA | limit | |",
              "| --- | --- | --- | --- | --- | --- | ---: | --- |"]
    for layout, H, Hkv, causal, fp8, dout_kind in [("BHSD", 16, 16, False, False, "randn"), ("BHSD", 16, 16, True, False, "randn"),
                                                   ("BSHD", 16, 4, False, False, "randn"), ("BSHD", 16, 4, True, False, "randn"),
                                                   ("packed", 8, 8, True, False, "randn"), ("BHSD", 8, 2, True, False, "sum"),
                                                   ("BHSD", 16, 16, False, True, "randn"), ("BSHD", 16, 4, True, True, "randn")]:
        q, k, v = inputs(layout, 2, H, Hkv, 1000, 128, gen)
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))   # leaves with the views' strides
        qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
        o = tilejit.attention(q, k, v, causal=causal, fp8=fp8)
        ref = reference(qf, kf, vf, causal)
        if dout_kind == "sum":   # an expanded gradient (stride 0), copied before the kernels read it
            o.float().sum().backward()
            ref.sum().backward()
        else:
            dout = torch.randn(o.shape, generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
            o.backward(dout)
            ref.backward(dout.float())
        errs = [rel_rmse(a.grad, b.grad) for a, b in ((q, qf), (k, kf), (v, vf))]
        limit = 1.2e-1 if fp8 else 1e-2   # fp8: the recipe's own error, 5-8e-2 (docs/numerics.md)
        good = all(e <= limit for e in errs) and all(torch.isfinite(t.grad).all().item() for t in (q, k, v))
        ok &= good
        lines.append(f"| {layout} | {H} / {Hkv} | {causal} | {fp8} | {dout_kind} | {' / '.join(f'{e:.2e}' for e in errs)} | "
                     f"{limit:.0e} | {'ok' if good else 'FAIL'} |")

    # 1b'. the variants' autograd: dq, dk, dv against float32 autograd of the variant's meaning
    lines += ["", "| variant | arg | causal | rel RMSE dq / dk / dv vs float32 | limit | |", "| --- | ---: | --- | --- | ---: | --- |"]
    for variant, arg, causal in [("sliding_window", 256.0, False), ("softcap", 30.0, True), ("softcap", 5.0, False), ("alibi", 0.0, True)]:
        q, k, v = inputs("BSHD", 2, 8, 8, 1000, 128, gen)
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
        o = tilejit.attention(q, k, v, causal=causal, variant=variant, variant_arg=arg)
        ref = variant_reference(qf, kf, vf, variant, arg, causal)
        dout = torch.randn(o.shape, generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
        o.backward(dout)
        ref.backward(dout.float())
        errs = [rel_rmse(a.grad, b.grad) for a, b in ((q, qf), (k, kf), (v, vf))]
        good = all(e <= 1e-2 for e in errs) and all(torch.isfinite(t.grad).all().item() for t in (q, k, v))
        ok &= good
        lines.append(f"| {variant} | {arg:g} | {causal} | {' / '.join(f'{e:.2e}' for e in errs)} | 1e-02 | {'ok' if good else 'FAIL'} |")

    # 1c. the FP8 linear layer and its autograd against float32 on the same bf16 values
    lines += ["", "| x | w | bias | rel RMSE y / dx / dw / dbias vs float32 | limit | |", "| --- | --- | --- | --- | ---: | --- |"]
    for xs, ws, with_bias in [((2, 1000, 1024), (512, 1024), True), ((4096, 768), (3072, 768), False)]:
        x = torch.randn(xs, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
        w = (torch.randn(ws, generator=gen, device="cuda") * ws[1] ** -0.5).to(torch.bfloat16).requires_grad_()
        b = torch.randn(ws[0], generator=gen, device="cuda").to(torch.bfloat16).requires_grad_() if with_bias else None
        xf, wf = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
        bf = b.detach().float().requires_grad_() if with_bias else None
        y = tilejit.fp8_linear(x, w, b)
        ref = F.linear(xf, wf, bf)
        dy = torch.randn(y.shape, generator=gen, device="cuda").to(torch.bfloat16)
        y.backward(dy)
        ref.backward(dy.float())
        errs = [rel_rmse(y, ref), rel_rmse(x.grad, xf.grad), rel_rmse(w.grad, wf.grad)]
        if with_bias:
            errs.append(rel_rmse(b.grad, bf.grad))
        good = all(e <= 8e-2 for e in errs) and y.shape == ref.shape and torch.isfinite(y).all().item()
        ok &= good
        lines.append(f"| {list(xs)} | {list(ws)} | {with_bias} | {' / '.join(f'{e:.2e}' for e in errs)} | 8e-02 | "
                     f"{'ok' if good else 'FAIL'} |")

    # 2. inside a torch.compile'd module (fullgraph: the op traces, no graph break), against SDPA
    torch.manual_seed(0)
    block = Block(2048, 16, 4).cuda().to(torch.bfloat16)
    x = torch.randn(2, 1024, 2048, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(lambda x: block(x, tilejit.scaled_dot_product_attention), fullgraph=True)
    with torch.no_grad():
        got = compiled(x)
        ref = block(x, F.scaled_dot_product_attention)
    err = rel_rmse(got, ref)
    good = err <= 1e-2
    ok &= good
    lines += ["", f"torch.compile(fullgraph=True) of an attention block (GQA 16 / 4, causal, [B, S, H, D] views) with "
              f"tilejit.scaled_dot_product_attention vs the same block with F.scaled_dot_product_attention: rel RMSE "
              f"{err:.2e} (limit 1e-2) {'ok' if good else 'FAIL'}"]
    # ... and its backward: the gradient of the block's weights through the compiled graph
    def weight_grads(sdpa, compile_it):
        block.zero_grad(set_to_none=True)
        fn = (lambda x: block(x, sdpa))
        if compile_it:
            fn = torch.compile(fn, fullgraph=True)
        y = fn(x)
        y.float().square().mean().backward()
        return [p.grad.detach().clone() for p in (block.qkv.weight, block.out.weight)]
    got_g = weight_grads(tilejit.scaled_dot_product_attention, True)
    ref_g = weight_grads(F.scaled_dot_product_attention, False)
    errs = [rel_rmse(a, b) for a, b in zip(got_g, ref_g)]
    good = all(e <= 2e-2 for e in errs)
    ok &= good
    lines += [f"Its backward through the compiled graph (loss mean(y^2)): rel RMSE of the qkv / out weights' gradients "
              f"{errs[0]:.2e} / {errs[1]:.2e} against the eager block with F.scaled_dot_product_attention (limit 2e-2) "
              f"{'ok' if good else 'FAIL'}"]

    # 3. per-call cost: the op from Python vs the C API from C++, at a launch-bound shape
    q, k, v = inputs("BHSD", 1, 1, 1, 128, 64, gen)
    o = torch.empty_like(q)
    iters = 2000

    # Round robin (each path once per round, median over rounds): the host's speed drifts during a run.
    paths = {
        "cxx": lambda: torch.ops.tilejit._launch_microseconds(q, k, v, o, False, iters),
        "ops": lambda: torch.ops.tilejit.attention(q, k, v),
        "default": lambda: torch.ops.tilejit.attention.default(q, k, v),
        "api": lambda: tilejit.attention(q, k, v),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    times = {name: [] for name in paths}
    for _ in range(7):
        for name, fn in paths.items():
            if name == "cxx":
                times[name].append(fn())
                continue
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e6 / iters)
    us = {name: statistics.median(t) for name, t in times.items()}
    good = us["api"] - us["cxx"] <= 5.0
    ok &= good
    lines += ["", f"Per call ({iters} calls then a synchronize; median of 7 rounds, each path once a round; B 1, H 1, "
              f"S 128, D 64, bf16): tj_attention_forward from C++ into a given output {us['cxx']:.2f} us; "
              f"tilejit.attention {us['api']:.2f} us: {us['api'] - us['cxx']:+.2f} us over C++ (limit 5) "
              f"{'ok' if good else 'FAIL'}; torch.ops.tilejit.attention {us['ops']:.2f} us, its .default overload "
              f"{us['default']:.2f} us; F.scaled_dot_product_attention {us['sdpa']:.2f} us"]

    # 4. bad inputs are errors that say what is wrong
    lines += [""]
    for what, fn, expect in [
        ("float32 q", lambda: torch.ops.tilejit.attention(q.float(), k, v), "tilejit takes bfloat16 or float16"),
        ("CPU tensors", lambda: torch.ops.tilejit.attention(q.cpu(), k.cpu(), v.cpu()), "must be CUDA tensors"),
        ("3 kv heads for 4", lambda: torch.ops.tilejit.attention(*inputs("BHSD", 1, 4, 3, 128, 64, gen)), "not a multiple"),
        ("attn_mask", lambda: tilejit.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(128, 128, device="cuda")),
         "attn_mask is not supported"),
        ("a gradient of an fp8 variant", lambda: tilejit.attention(q.detach().requires_grad_(), k, v, fp8=True, variant="softcap",
                                                                  variant_arg=30.0).float().sum().backward(),
         "no backward for variant 'softcap' with fp8=True"),
        ("fp8_linear of a float64 x", lambda: tilejit.fp8_linear(q.double().reshape(-1, 64), k.reshape(-1, 64)), "bfloat16 or float16"),
        ("fp8_linear x [.., 64] and w [.., 128]", lambda: tilejit.fp8_linear(q.reshape(-1, 64), q.reshape(-1, 128)), "do not fit"),
        ("the op itself: fp8_linear x [.., 64] and w [.., 128]",
         lambda: torch.ops.tilejit.fp8_linear(q.reshape(-1, 64), q.reshape(-1, 128)), "do not fit: [128, 64] and [64, 128]"),
        ("the op itself: a 3-dim q", lambda: torch.ops.tilejit.attention(q[0], k[0], v[0]), "must be [B, H, S, D] (4 dims), got [1, 128, 64]"),
    ]:
        try:
            fn()
            good, msg = False, "no error"
        except (RuntimeError, NotImplementedError) as e:
            msg = str(e).splitlines()[0]
            good = expect in str(e)
        ok &= good
        lines.append(f"- {what}: {'ok' if good else 'FAIL'}: {msg}")

    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
