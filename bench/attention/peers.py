#!/usr/bin/env python3
"""Attention forward peers of tilejit on the GPU, timed like tilejit times itself.

Peers (each fails soft: a missing package or an error costs that peer's cells, never the run):
  sdpa_flash_bf16   torch.nn.functional.scaled_dot_product_attention, bf16, FLASH_ATTENTION backend
  sdpa_cudnn_bf16   the same with the CUDNN_ATTENTION backend
  triton_fp8        this file's own Triton FP8 flash attention (below): e4m3 Q, K and V with
                    per-(b, h) descales (V pre-transposed), fp32 accumulation, online softmax in
                    exp2, P quantized to e4m3 before P.V; timed on pre-quantized inputs, like
                    tilejit's "fp8" column

Shapes: the issue's grid, B*S = 16384, H*D = 2048, S in {1k .. 16k}, D in {64, 128, 256}, causal
and not; TFLOP/s = 4*B*H*S^2*D / time (half for causal). Method: warm-up, then the median of
--reps launches, each between two CUDA events with the L2 flushed before it (a 256 MiB write);
random N(0, 1) bf16 inputs.

Accuracy: each peer's output on 2 heads (the first and the last (b, h)) against float32 SDPA of
the bf16 inputs on those heads ("rrmse", the basis of tilejit's column); the Triton kernel is
also checked against float32 SDPA of its dequantized e4m3 inputs (its own error: P's rounding
and the accumulation), and a result over tolerance is reported ok=0.

Usage (tilejit bench attention runs it; alone it prints the same table of its own rows):
  python3 bench/attention/peers.py [--shapes 2048x128x0,2048x128x1] [--seq S] [--head-dim D]
      [--causal|--non-causal] [--reps N] [--warmup N] [--quick] [--csv FILE] [--only PEER,...]
CSV columns: S,D,B,H,causal,peer,ms,tflops,rrmse,ok,note; lines starting with '#' are notes.
"""
import argparse
import math
import sys
import traceback

TOKENS = 16384      # B * S
WIDTH = 2048        # H * D
SEQS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128, 256)
FP8_MAX = 448.0     # largest finite e4m3 (float8_e4m3fn)
P_OFFSET = 8.0      # P = exp2(s - m + 8) lies in [0, 256]: e4m3's range at full relative precision
LOG2E = 1.4426950408889634
PEERS = ("sdpa_flash_bf16", "sdpa_cudnn_bf16", "triton_fp8")
# Triton kernel vs float32 SDPA of its own dequantized inputs: P's e4m3 rounding alone costs
# ~2.6e-2 relative RMSE on N(0, 1) (bench/attention/README.md), so anything past this is a bug.
TRITON_OWN_ERROR_TOL = 5e-2


def flops(B, H, S, D, causal):
    return 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)


def one_line(e):
    text = str(e).strip().splitlines()
    return (type(e).__name__ + ": " + (text[0] if text else "")).replace(",", ";")[:200]


# ---------------------------------------------------------------------------------------------
# The Triton FP8 flash attention forward.
#
#   q8, k8 [B, H, S, D] e4m3 (contiguous), vt8 [B, H, D, S] e4m3 (V transposed, so that both dots
#   read their B operand K-major, as FP8 wgmma needs), descale [3, B*H] f32 (q, k, v: x = x8 * ds),
#   o [B, H, S, D] bf16. One program per (query block, b*h).
#   S_ij = (q8 k8^T) * (scale * log2 e * q_ds * k_ds); the running max m, the row sum l and the
#   accumulator stay fp32; P = exp2(S - m + 8) is cast to e4m3 for P.V; o = acc * v_ds / l (the
#   offset cancels).  Causal masks key j > query i (top-left), only in the diagonal blocks.
# ---------------------------------------------------------------------------------------------
try:
    import triton
    import triton.language as tl
    TRITON_ERROR = None
except Exception as _e:  # noqa: BLE001
    triton = None
    tl = None
    TRITON_ERROR = one_line(_e)

if triton is not None:
    def _configs():
        out = []
        for block_n in (64, 128):
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    out.append(triton.Config({"BLOCK_M": 128, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages))
        return out

    def _prune(configs, named_args, **kwargs):
        """Drops configs that cannot fit: 4 warps hold a 128 x 256 fp32 accumulator in 256
        registers a thread (spills), and 4 stages of 128-key K and V blocks at D = 256 exceed
        shared memory."""
        d = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        keep = []
        for c in configs:
            if d == 256 and c.num_warps < 8:
                continue
            if d == 256 and c.kwargs["BLOCK_N"] == 128 and c.num_stages > 2:
                continue
            keep.append(c)
        return keep or configs

    @triton.jit
    def _fp8_attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vd, qk_scale, offs_m, offs_n, offs_d,
                         lo, hi, N_CTX, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
        """Key blocks [lo, hi): MASKED adds the bounds (and, when CAUSAL, the diagonal) mask."""
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n
            k_ptrs = k_base + cols[:, None] * stride_ks + offs_d[None, :]        # [BLOCK_N, D], D contiguous
            v_ptrs = v_base + offs_d[:, None] * stride_vd + cols[None, :]        # [D, BLOCK_N], keys contiguous
            if MASKED:
                k = tl.load(k_ptrs, mask=cols[:, None] < N_CTX, other=0.0)
                vt = tl.load(v_ptrs, mask=cols[None, :] < N_CTX, other=0.0)
            else:
                k = tl.load(k_ptrs)
                vt = tl.load(v_ptrs)
            s = tl.dot(q, tl.trans(k)) * qk_scale                                 # fp32 [BLOCK_M, BLOCK_N]
            if MASKED:
                keep = cols[None, :] < N_CTX
                if CAUSAL:
                    keep = keep & (offs_m[:, None] >= cols[None, :])
                s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - (m_new - 8.0)[:, None])                          # P_OFFSET = 8
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(tl.float8e4nv), tl.trans(vt), acc)
            m_i = m_new
        return acc, l_i, m_i

    @triton.autotune(configs=_configs(), key=["N_CTX", "HEAD_DIM", "CAUSAL"], prune_configs_by={"early_config_prune": _prune})
    @triton.jit
    def _fp8_attn_fwd(Q, K, VT, O, Descale, sm_scale_log2,
                      stride_qbh, stride_qs, stride_kbh, stride_ks, stride_vbh, stride_vd, stride_obh, stride_os,
                      BH, N_CTX,
                      HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        if CAUSAL:
            pid_m = tl.num_programs(0) - 1 - pid_m       # the longest rows first
        q_ds = tl.load(Descale + bh)
        k_ds = tl.load(Descale + BH + bh)
        v_ds = tl.load(Descale + 2 * BH + bh)
        qk_scale = sm_scale_log2 * q_ds * k_ds           # the descales fold into the score scale
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        bh64 = bh.to(tl.int64)
        q = tl.load(Q + bh64 * stride_qbh + offs_m[:, None] * stride_qs + offs_d[None, :],
                    mask=offs_m[:, None] < N_CTX, other=0.0)
        k_base = K + bh64 * stride_kbh
        v_base = VT + bh64 * stride_vbh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        if CAUSAL:
            # keys below this query block need no mask; the diagonal block(s) do
            full_hi = pid_m * BLOCK_M
            last = tl.minimum((pid_m + 1) * BLOCK_M, N_CTX)
        else:
            full_hi = (N_CTX // BLOCK_N) * BLOCK_N
            last = N_CTX
        acc, l_i, m_i = _fp8_attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vd, qk_scale,
                                         offs_m, offs_n, offs_d, 0, full_hi, N_CTX, False, CAUSAL, BLOCK_N)
        acc, l_i, m_i = _fp8_attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vd, qk_scale,
                                         offs_m, offs_n, offs_d, full_hi, last, N_CTX, True, CAUSAL, BLOCK_N)
        out = acc * (v_ds / l_i)[:, None]
        tl.store(O + bh64 * stride_obh + offs_m[:, None] * stride_os + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=offs_m[:, None] < N_CTX)


def triton_fp8_attention(torch, q8, k8, vt8, descale, causal):
    """o = attention(q8, k8, v) in bf16 for e4m3 q8, k8 [B, H, S, D], vt8 [B, H, D, S], descale [3, B*H]."""
    B, H, S, D = q8.shape
    assert q8.is_contiguous() and k8.is_contiguous() and vt8.is_contiguous() and vt8.shape == (B, H, D, S)
    o = torch.empty((B, H, S, D), dtype=torch.bfloat16, device=q8.device)
    grid = lambda meta: (triton.cdiv(S, meta["BLOCK_M"]), B * H)  # noqa: E731
    _fp8_attn_fwd[grid](q8, k8, vt8, o, descale, LOG2E / math.sqrt(D),
                        q8.stride(1), q8.stride(2), k8.stride(1), k8.stride(2), vt8.stride(1), vt8.stride(2),
                        o.stride(1), o.stride(2), B * H, S, HEAD_DIM=D, CAUSAL=causal)
    return o


def quantize_e4m3(torch, x):
    """Per-(b, h) amax scaling to e4m3: (x8, descale [B, H]) with x ~= x8 * descale."""
    amax = x.abs().amax(dim=(2, 3)).float()
    descale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    x8 = (x.float() / descale[:, :, None, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return x8, descale


# ---------------------------------------------------------------------------------------------
# Timing and checking
# ---------------------------------------------------------------------------------------------
class Timer:
    """Median of CUDA-event-timed calls, the L2 flushed before each (outside the events)."""

    def __init__(self, torch, reps, warmup):
        self.torch, self.reps, self.warmup = torch, reps, warmup
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def median_ms(self, fn):
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for a, b in zip(starts, stops):
            self.flush.zero_()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times = sorted(a.elapsed_time(b) for a, b in zip(starts, stops))
        return times[len(times) // 2]


def check_heads(B, H):
    """The (b, h) pairs the accuracy check looks at: the first and the last."""
    return sorted({(0, 0), (B - 1, H - 1)})


def reference_f32(torch, F, q, k, v, causal, heads):
    """float32 SDPA of q, k, v (any float dtype) on the given (b, h): [len(heads), S, D]."""
    idx_b = [b for b, _ in heads]
    idx_h = [h for _, h in heads]
    qs = q[idx_b, idx_h].float().unsqueeze(0)
    ks = k[idx_b, idx_h].float().unsqueeze(0)
    vs = v[idx_b, idx_h].float().unsqueeze(0)
    return F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)[0]


def rel_rmse(torch, got, ref):
    got = got.double()
    ref = ref.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-300))


def take_heads(o, heads):
    return o[[b for b, _ in heads], [h for _, h in heads]]


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def parse_shapes(args):
    """[(B, H, S, D, causal)] from --shapes, or the grid filtered by --seq / --head-dim / mask / --quick."""
    out = []
    if args.shapes:
        for part in args.shapes.split(","):
            s, d, c = (int(x) for x in part.strip().split("x"))
            out.append((max(1, TOKENS // s), max(1, WIDTH // d), s, d, c != 0))
        return out
    seqs = (2048,) if args.quick else SEQS
    dims = (128,) if args.quick else HEAD_DIMS
    if args.seq:
        seqs = (args.seq,)
    if args.head_dim:
        dims = (args.head_dim,)
    masks = (True,) if args.causal else (False,) if args.non_causal else (False, True)
    for d in dims:
        for s in seqs:
            for c in masks:
                out.append((max(1, TOKENS // s), max(1, WIDTH // d), s, d, c))
    return out


class Results:
    def __init__(self, csv_path):
        self.rows = []
        self.notes = []
        self.csv = open(csv_path, "w") if csv_path else None
        if self.csv:
            self.csv.write("S,D,B,H,causal,peer,ms,tflops,rrmse,ok,note\n")
            self.csv.flush()

    def note(self, text):
        print("note: " + text)
        self.notes.append(text)
        if self.csv:
            self.csv.write("# " + text.replace("\n", " ") + "\n")
            self.csv.flush()

    def add(self, shape, peer, ms, tf, rr, ok, note=""):
        B, H, S, D, causal = shape
        self.rows.append((shape, peer, ms, tf, rr, ok, note))
        if self.csv:  # written as it goes: a crash later keeps what finished
            self.csv.write("%d,%d,%d,%d,%d,%s,%.6f,%.3f,%s,%d,%s\n" % (
                S, D, B, H, 1 if causal else 0, peer, ms, tf, "" if rr is None else "%.4e" % rr, 1 if ok else 0,
                note.replace("\n", " ")))
            self.csv.flush()


def run(args):
    res = Results(args.csv)
    only = set(args.only.split(",")) if args.only else set(PEERS)
    shapes = parse_shapes(args)
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        res.note("peers: torch not available (%s): no peer rows" % one_line(e))
        return res
    if not torch.cuda.is_available():
        res.note("peers: torch %s sees no CUDA device: no peer rows" % torch.__version__)
        return res
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # noqa: BLE001
        SDPBackend = sdpa_kernel = None
        res.note("peers: torch.nn.attention.sdpa_kernel unavailable (%s): no SDPA rows" % one_line(e))
    res.note("peers: torch %s, %s, cuDNN %s, triton %s" % (
        torch.__version__, torch.cuda.get_device_name(0), torch.backends.cudnn.version(),
        triton.__version__ if triton is not None else "not available (%s)" % TRITON_ERROR))
    if "triton_fp8" in only and triton is None:
        res.note("peers: triton_fp8 skipped: triton not importable (%s)" % TRITON_ERROR)
        only.discard("triton_fp8")
    if not hasattr(torch, "float8_e4m3fn"):
        res.note("peers: triton_fp8 skipped: torch has no float8_e4m3fn")
        only.discard("triton_fp8")
    timer = Timer(torch, args.reps, args.warmup)
    # (peer, D, causal) -> first error. A failure usually repeats for the same head dim and mask
    # (an unsupported backend, a kernel that does not compile): note it once, skip the rest of
    # that kind, and try again on the next head dim.
    failed = {}

    def attempt(peer, shape, fn):
        kind = (peer, shape[3], shape[4])
        if peer not in only or kind in failed:
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            failed[kind] = one_line(e)
            res.note("peers: %s failed at S=%d D=%d causal=%d: %s (skipped for this D and mask)" % (
                peer, shape[2], shape[3], shape[4], failed[kind]))
            if args.verbose:
                traceback.print_exc()
            try:
                torch.cuda.synchronize()   # let a failed launch surface here, not in the next peer
            except Exception:  # noqa: BLE001
                pass

    gen = torch.Generator(device="cuda")
    cache = {}
    for shape in shapes:
        B, H, S, D, causal = shape
        key = (B, H, S, D)
        if key not in cache:   # inputs per (B, H, S, D); causal and not share them
            cache.clear()
            torch.cuda.empty_cache()
            gen.manual_seed(args.seed + S * 7 + D)
            q = torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16, generator=gen)
            v = torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16, generator=gen)
            cache[key] = (q, k, v, {})
        q, k, v, quant = cache[key]
        heads = check_heads(B, H)
        ref = reference_f32(torch, F, q, k, v, causal, heads)
        fl = flops(B, H, S, D, causal)
        line = ["S=%5d D=%3d causal=%d" % (S, D, causal)]

        for peer, backend in (("sdpa_flash_bf16", "FLASH_ATTENTION"), ("sdpa_cudnn_bf16", "CUDNN_ATTENTION")):
            def sdpa(peer=peer, backend=backend):
                if sdpa_kernel is None:
                    raise RuntimeError("no sdpa_kernel")
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
                    o = fn()
                    torch.cuda.synchronize()
                    rr = rel_rmse(torch, take_heads(o, heads), ref)
                    ms = timer.median_ms(fn)
                res.add(shape, peer, ms, fl / (ms * 1e-3) / 1e12, rr, rr <= 1e-2)
                line.append("%s %.1f (rRMSE %.1e)" % (peer, fl / (ms * 1e-3) / 1e12, rr))
            attempt(peer, shape, sdpa)

        def triton_peer():
            if "q8" not in quant:
                q8, qd = quantize_e4m3(torch, q)
                k8, kd = quantize_e4m3(torch, k)
                v8, vd = quantize_e4m3(torch, v)
                quant["q8"], quant["k8"] = q8, k8
                quant["vt8"] = v8.transpose(2, 3).contiguous()       # [B, H, D, S]: K-major for P.V
                quant["ds"] = torch.stack([qd.reshape(-1), kd.reshape(-1), vd.reshape(-1)]).contiguous()
                quant["deq"] = (q8.float() * qd[:, :, None, None], k8.float() * kd[:, :, None, None],
                                v8.float() * vd[:, :, None, None])
            fn = lambda: triton_fp8_attention(torch, quant["q8"], quant["k8"], quant["vt8"], quant["ds"], causal)  # noqa: E731
            o = fn()   # the first call autotunes for this (S, D, causal)
            torch.cuda.synchronize()
            got = take_heads(o, heads)
            rr = rel_rmse(torch, got, ref)
            dq, dk, dv = quant["deq"]
            own = rel_rmse(torch, got, reference_f32(torch, F, dq, dk, dv, causal, heads))
            ms = timer.median_ms(fn)
            cfg = getattr(_fp8_attn_fwd, "best_config", None)
            cfg_text = ("BLOCK_N %s warps %s stages %s" % (cfg.kwargs.get("BLOCK_N"), cfg.num_warps, cfg.num_stages)
                        if cfg is not None else "")
            ok = own <= TRITON_OWN_ERROR_TOL
            res.add(shape, "triton_fp8", ms, fl / (ms * 1e-3) / 1e12, rr, ok,
                    "%s; rRMSE vs its dequantized inputs %.2e%s" % (cfg_text, own, "" if ok else " FAIL"))
            line.append("triton_fp8 %.1f (rRMSE %.1e, own %.1e%s) [%s]" % (
                fl / (ms * 1e-3) / 1e12, rr, own, "" if ok else " FAIL", cfg_text))
        attempt("triton_fp8", shape, triton_peer)
        print("  " + "  ".join(line))
        sys.stdout.flush()
    return res


def print_table(res):
    by_shape = {}
    for shape, peer, ms, tf, rr, ok, note in res.rows:
        by_shape.setdefault(shape, {})[peer] = (tf, rr, ok)
    print("\n| D | S | B×H | causal | SDPA flash bf16 | SDPA cuDNN bf16 | Triton fp8 | Triton fp8 / cuDNN | rRMSE Triton fp8 |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for (B, H, S, D, causal), row in sorted(by_shape.items(), key=lambda x: (x[0][3], x[0][2], x[0][4])):
        def tf(p):
            return "%.1f%s" % (row[p][0], "" if row[p][2] else " (FAIL)") if p in row else "n/a"
        cu = row.get("sdpa_cudnn_bf16")
        tr = row.get("triton_fp8")
        print("| %d | %d | %d×%d | %s | %s | %s | %s | %s | %s |" % (
            D, S, B, H, "yes" if causal else "no", tf("sdpa_flash_bf16"), tf("sdpa_cudnn_bf16"), tf("triton_fp8"),
            "%.2f" % (tr[0] / cu[0]) if tr and cu else "n/a", "%.1e" % tr[1] if tr and tr[1] is not None else "n/a"))
    for n in res.notes:
        print("- " + n)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="SxDxC,... (C: 1 causal); B = 16384 / S, H = 2048 / D")
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--head-dim", type=int, default=0)
    mask = ap.add_mutually_exclusive_group()
    mask.add_argument("--causal", action="store_true")
    mask.add_argument("--non-causal", action="store_true")
    ap.add_argument("--quick", action="store_true", help="S 2048, D 128, causal and not")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--csv", help="write the rows here (tilejit bench attention reads it)")
    ap.add_argument("--only", help="comma-separated peers: " + ",".join(PEERS))
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing peers")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    try:
        res = run(args)
    except Exception as e:  # noqa: BLE001  (the CSV keeps what finished; say why it stopped)
        traceback.print_exc()
        print("peers: stopped: %s" % one_line(e))
        return 1
    if not args.csv:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
