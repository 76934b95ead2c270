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

--variants mode (tilejit bench variants runs it): issue #7's attention variants (causal,
sliding_window, alibi, softcap, prefix_lm, gqa, segment, documents, block_mask, dilated; their
parameters on the command line), bf16, B*S = 16384, H*D = 2048, S from --seqs:
  flex_bf16       torch.compile(flex_attention) with the variant's score_mod / mask_mod and a
                  BlockMask from create_block_mask (built once, outside the timing), so flex
                  skips the blocks the mask rules out, as tilejit does; GQA with enable_gqa;
                  documents with a mask_mod on a document-id tensor (the usual flex recipe);
                  block_mask with a mask_mod on the cell tensor; dilated in one call: mask_mod
                  "some pair has the key", score_mod + log(pairs that have it) (= the mix)
  sdpa_mask_bf16  scaled_dot_product_attention with a boolean attn_mask (sliding_window,
                  prefix_lm, segment, documents, block_mask), an additive bf16 mask [1, H, S, S]
                  (dilated) or is_causal=True (causal, gqa), backend chosen by PyTorch
documents: causal document masking of packed sequences (varlen), the same packing in every batch
entry: document d has length S*EIGHTHS[d]/8 + SHIFTS[d] (rounded down; the last: the rest of S).
TFLOP/s = 4*D*(visible score entries) / time, the entries counted from the mask; accuracy vs
float32 attention with the variant's meaning on 2 heads (ok: rRMSE <= 1e-2).
  python3 bench/attention/peers.py --variants causal,gqa [--seqs 2048,8192] [--head-dim 128]
      [--window 1024] [--segment 2048] [--softcap 30] [--gqa-group 4] [--prefix-div 4]
      [--doc-eighths 1,3,2,2] [--doc-shifts 37,-90,70,-17] [--block-cell 128]
      [--dilated 2048:1,4096:2,8192:4] [--csv FILE]
CSV columns: variant,S,D,B,H,Hkv,peer,ms,tflops,rrmse,ok,note.

--backward mode (tilejit bench attention --backward runs it): the backward alone of SDPA, bf16,
over the same grid: torch.autograd.grad through one saved forward per backend (its own graph,
retained), random N(0, 1) dO; TFLOP/s = 2.5 * the forward's FLOPs / time:
  sdpa_flash_bf16_bwd   FLASH_ATTENTION backend
  sdpa_cudnn_bf16_bwd   CUDNN_ATTENTION backend
rrmse: the largest of dq's, dk's and dv's relative RMS error on 2 heads against float32
autograd through float32 SDPA of the same bf16 inputs (ok: <= 3e-2). Same CSV columns as the forward.
"""
import argparse
import math
import sys
import time
import traceback

TOKENS = 16384      # B * S
WIDTH = 2048        # H * D
SEQS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128, 256)
FP8_MAX = 448.0     # largest finite e4m3 (float8_e4m3fn)
P_OFFSET = 8.0      # P = exp2(s - m + 8) lies in [0, 256]: e4m3's range at full relative precision
LOG2E = 1.4426950408889634
PEERS = ("sdpa_flash_bf16", "sdpa_cudnn_bf16", "triton_fp8")
BACKWARD_PEERS = ("sdpa_flash_bf16_bwd", "sdpa_cudnn_bf16_bwd")
BACKWARD_TOL = 3e-2
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
    """Rows and notes of a run, written to the CSV as they come (a crash later keeps what finished)."""

    HEADER = "S,D,B,H,causal,peer,ms,tflops,rrmse,ok,note"

    def __init__(self, csv_path):
        self.rows = []
        self.notes = []
        self.csv = open(csv_path, "w") if csv_path else None
        if self.csv:
            self.csv.write(self.HEADER + "\n")
            self.csv.flush()

    def note(self, text):
        print("note: " + text)
        self.notes.append(text)
        if self.csv:
            self.csv.write("# " + text.replace("\n", " ") + "\n")
            self.csv.flush()

    def write(self, key_fields, peer, ms, tf, rr, ok, note):
        """One CSV line: the key's fields, then peer,ms,tflops,rrmse,ok,note (the note last: it may hold commas)."""
        if self.csv:
            self.csv.write(",".join(str(f) for f in key_fields) + ",%s,%.6f,%.3f,%s,%d,%s\n" % (
                peer, ms, tf, "" if rr is None else "%.4e" % rr, 1 if ok else 0, note.replace("\n", " ")))
            self.csv.flush()

    def add(self, shape, peer, ms, tf, rr, ok, note=""):
        B, H, S, D, causal = shape
        self.rows.append((shape, peer, ms, tf, rr, ok, note))
        self.write((S, D, B, H, 1 if causal else 0), peer, ms, tf, rr, ok, note)


class Attempts:
    """Runs peers' measurements failing soft: an exception costs that peer's cell, and, since a
    failure usually repeats for the same kind of problem (an unsupported backend, a kernel that
    does not compile), it is noted once and the rest of that kind is skipped."""

    def __init__(self, torch, res, only, verbose):
        self.torch, self.res, self.only, self.verbose = torch, res, only, verbose
        self.failed = {}

    def __call__(self, peer, kind, where, scope, fn):
        """fn() for `peer` unless it is not asked for or `kind` failed before; `where` and `scope`
        say where it failed and what is skipped from then on."""
        if peer not in self.only or kind in self.failed:
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            self.failed[kind] = one_line(e)
            self.res.note("peers: %s failed at %s: %s (skipped for %s)" % (peer, where, self.failed[kind], scope))
            if self.verbose:
                traceback.print_exc()
            try:
                self.torch.cuda.synchronize()   # let a failed launch surface here, not in the next peer
            except Exception:  # noqa: BLE001
                pass


def cuda_torch(res):
    """(torch, torch.nn.functional) where torch imports and sees a CUDA device; else None, noted."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        res.note("peers: torch not available (%s): no peer rows" % one_line(e))
        return None
    if not torch.cuda.is_available():
        res.note("peers: torch %s sees no CUDA device: no peer rows" % torch.__version__)
        return None
    return torch, F


def run(args):
    res = Results(args.csv)
    only = set(args.only.split(",")) if args.only else set(PEERS)
    shapes = parse_shapes(args)
    loaded = cuda_torch(res)
    if loaded is None:
        return res
    torch, F = loaded
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
    attempts = Attempts(torch, res, only, args.verbose)

    def attempt(peer, shape, fn):
        # A failure is skipped for the rest of its (peer, head dim, mask); the next head dim tries again.
        attempts(peer, (peer, shape[3], shape[4]), "S=%d D=%d causal=%d" % (shape[2], shape[3], shape[4]),
                 "this D and mask", fn)

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


def reference_grads_f32(torch, F, q, k, v, do, causal, heads):
    """float32 gradients (dq, dk, dv) of SDPA on the given (b, h), through float32 autograd."""
    idx_b = [b for b, _ in heads]
    idx_h = [h for _, h in heads]
    xs = [t[idx_b, idx_h].detach().float().unsqueeze(0).requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*xs, is_causal=causal)
    return [g[0] for g in torch.autograd.grad(o, xs, do[idx_b, idx_h].float().unsqueeze(0))]


def run_backward(args):
    res = Results(args.csv)
    only = set(args.only.split(",")) if args.only else set(BACKWARD_PEERS)
    shapes = parse_shapes(args)
    loaded = cuda_torch(res)
    if loaded is None:
        return res
    torch, F = loaded
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # noqa: BLE001
        res.note("peers: torch.nn.attention.sdpa_kernel unavailable (%s): no SDPA rows" % one_line(e))
        return res
    res.note("peers: torch %s, %s, cuDNN %s (backward)" % (
        torch.__version__, torch.cuda.get_device_name(0), torch.backends.cudnn.version()))
    timer = Timer(torch, args.reps, args.warmup)
    attempts = Attempts(torch, res, only, args.verbose)
    gen = torch.Generator(device="cuda")
    for shape in shapes:
        B, H, S, D, causal = shape
        torch.cuda.empty_cache()
        gen.manual_seed(args.seed + S * 7 + D)
        q, k, v, do = (torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        heads = check_heads(B, H)
        ref = reference_grads_f32(torch, F, q, k, v, do, causal, heads)
        fl = 2.5 * flops(B, H, S, D, causal)
        line = ["S=%5d D=%3d causal=%d" % (S, D, causal)]
        for peer, backend in (("sdpa_flash_bf16_bwd", "FLASH_ATTENTION"), ("sdpa_cudnn_bf16_bwd", "CUDNN_ATTENTION")):
            def sdpa_bwd(peer=peer, backend=backend):
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    fn = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
                    grads = fn()
                    torch.cuda.synchronize()
                    rr = max(rel_rmse(torch, take_heads(g, heads), r) for g, r in zip(grads, ref))
                    del grads
                    ms = timer.median_ms(fn)
                res.add(shape, peer, ms, fl / (ms * 1e-3) / 1e12, rr, rr <= BACKWARD_TOL)
                line.append("%s %.1f (rRMSE %.1e)" % (peer, fl / (ms * 1e-3) / 1e12, rr))
            attempts(peer, (peer, D, causal), "S=%d D=%d causal=%d" % (S, D, causal), "this D and mask", sdpa_bwd)
        print("  " + "  ".join(line))
        sys.stdout.flush()
        del q, k, v, do
    return res


def print_backward_table(res):
    print("\n| D | S | B×H | causal | peer | TFLOP/s | rRMSE |")
    print("| ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for (B, H, S, D, causal), peer, ms, tf, rr, ok, note in res.rows:
        print("| %d | %d | %d×%d | %s | %s | %.1f%s | %.1e |" % (D, S, B, H, "yes" if causal else "no", peer, tf,
                                                            "" if ok else " (FAIL)", rr))
    for n in res.notes:
        print("- " + n)


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


# ---------------------------------------------------------------------------------------------
# --variants: issue #7's attention variants (tilejit bench variants runs this mode)
# ---------------------------------------------------------------------------------------------
VARIANTS = ("causal", "sliding_window", "alibi", "softcap", "prefix_lm", "gqa", "segment", "documents", "block_mask",
            "dilated")
VARIANT_PEERS = ("flex_bf16", "sdpa_mask_bf16", "flex_bf16_bwd")   # flex_bf16_bwd: with --backward
# What SDPA can run: a boolean attn_mask (sliding_window, prefix_lm, segment, documents) or
# is_causal (causal, gqa); dilated an additive bf16 mask (log of the pairs that have the key).
# ALiBi would need an additive float bias tensor and softcap a score function: not masks.
SDPA_VARIANTS = ("causal", "sliding_window", "prefix_lm", "gqa", "segment", "documents", "block_mask", "dilated")


def int_list(text):
    return [int(x) for x in text.split(",")]


def dilated_pairs(text):
    """--dilated W:R,...: LongNet's (segment, rate) pairs."""
    pairs = [tuple(int(x) for x in p.split(":")) for p in text.split(",")]
    if any(len(p) != 2 or p[0] < 1 or p[1] < 1 or p[0] % p[1] for p in pairs):
        raise ValueError("--dilated takes W:R pairs with R dividing W, got %r" % text)
    return pairs


def dilated_entries(S, H, pairs):
    """Each pair's score entries of one batch entry, summed (tilejit's count, bench_variants.cpp)."""
    total = 0
    for w, r in pairs:
        for offset in range(r):
            for start in range(0, S, w):
                end = min(start + w, S)
                first = start + (offset - start % r) % r
                n = (end - 1 - first) // r + 1 if first < end else 0
                total += n * n * (H // r)
    return total


def document_cu_seqlens(S, eighths, shifts):
    """documents: cu_seqlens [len(eighths) + 1] at S, as tilejit computes it (tools/bench_variants.cpp
    variant_cu_seqlens): document d of length S*eighths[d]//8 + shifts[d], the last the rest of S."""
    cu = [0]
    for d in range(len(eighths)):
        length = S * eighths[d] // 8 + shifts[d] if d + 1 < len(eighths) else S - cu[-1]
        if length < 1:
            raise ValueError("documents: document %d of %d would have length %d at S = %d" % (d, len(eighths), length, S))
        cu.append(cu[-1] + length)
    return cu


class VariantCase:
    """One variant at one shape, with its meaning written once as FlexAttention mods.

    mask_mod(b, h, q_idx, kv_idx) -> bool and score_mod(score, b, h, q_idx, kv_idx) -> score (None:
    the score as is) take flex_attention's scalar index tensors, and broadcast the same way over
    index grids, which is how the explicit SDPA masks, the float32 reference and the visible count
    are built from them: one definition, so the peers cannot drift apart from each other. The
    meaning is tilejit's (tools/bench_variants.cpp, kernels/attention_variants.cpp): top-left
    aligned masks, the score in natural-log units after the 1/sqrt(D) scale.
    """

    def __init__(self, torch, name, S, D, args):
        self.name, self.S, self.D = name, S, D
        self.B, self.H = max(1, TOKENS // S), max(1, WIDTH // D)
        self.Hkv = max(1, self.H // args.gqa_group) if name == "gqa" else self.H
        self.per_batch = False    # the mask depends on b (the BlockMask then has a batch dim)
        self.per_head = False     # the mask depends on h (the BlockMask then has a head dim)
        self.entries = None       # score entries of the FLOP count when not the mask's (dilated)
        self.score_mod = None

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        self.mask_mod = causal
        if name in ("causal", "gqa"):
            pass
        elif name == "sliding_window":
            window = args.window

            def sliding_window(b, h, q_idx, kv_idx):
                return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
            self.mask_mod = sliding_window
        elif name == "alibi":
            slopes = torch.exp2(-8.0 * torch.arange(1, self.H + 1, device="cuda", dtype=torch.float32) / self.H)

            def alibi(score, b, h, q_idx, kv_idx):
                return score + slopes[h] * (kv_idx - q_idx)
            self.score_mod = alibi
        elif name == "softcap":
            cap = float(args.softcap)

            def softcap(score, b, h, q_idx, kv_idx):
                return cap * torch.tanh(score / cap)
            self.score_mod = softcap
        elif name == "prefix_lm":
            prefix = torch.full((self.B,), S // args.prefix_div, device="cuda", dtype=torch.int64)
            self.per_batch = True

            def prefix_lm(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx) | (kv_idx < prefix[b])
            self.mask_mod = prefix_lm
        elif name == "segment":
            segment = args.segment

            def segment_mask(b, h, q_idx, kv_idx):
                return (q_idx // segment) == (kv_idx // segment)
            self.mask_mod = segment_mask
        elif name == "documents":
            # One packing for every batch entry (tilejit's kernel reads one cu_seqlens for all b):
            # doc_id[i] = the document of position i; a query sees the earlier keys of its own.
            self.cu_seqlens = document_cu_seqlens(S, int_list(args.doc_eighths), int_list(args.doc_shifts))
            lengths = [self.cu_seqlens[d + 1] - self.cu_seqlens[d] for d in range(len(self.cu_seqlens) - 1)]
            doc_id = torch.repeat_interleave(torch.arange(len(lengths), device="cuda", dtype=torch.int32),
                                             torch.tensor(lengths, device="cuda"))

            def document_mask(b, h, q_idx, kv_idx):
                return (doc_id[q_idx] == doc_id[kv_idx]) & (kv_idx <= q_idx)
            self.mask_mod = document_mask
        elif name == "block_mask":
            # tilejit's block_mask_variant(cell, cell, causal) with bench_variants.cpp's pattern.
            cell = args.block_cell
            n = (S + cell - 1) // cell
            bi = torch.arange(n, device="cuda")[:, None]
            bj = torch.arange(n, device="cuda")[None, :]
            cells = (bj == bi) | (bj + 1 == bi) | (bj == 0) | ((131 * bi + 71 * bj) % 7 == 0)

            def block_mask(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx) & cells[q_idx // cell, kv_idx // cell]
            self.mask_mod = block_mask
        elif name == "dilated":
            # LongNet's pairs mixed by their logsumexps = softmax over the keys, each key weighted
            # by the number of pairs that have it (same segment of w, both at offset h mod r).
            pairs = dilated_pairs(args.dilated)
            self.per_head = True
            self.entries = dilated_entries(S, self.H, pairs) * self.B

            def pair_has(w, r, h, q_idx, kv_idx):
                return ((q_idx // w) == (kv_idx // w)) & ((q_idx % r) == (h % r)) & ((kv_idx % r) == (h % r))

            def dilated_mask(b, h, q_idx, kv_idx):
                keep = pair_has(*pairs[0], h, q_idx, kv_idx)
                for w, r in pairs[1:]:
                    keep = keep | pair_has(w, r, h, q_idx, kv_idx)
                return keep

            def dilated_score(score, b, h, q_idx, kv_idx):
                count = torch.where(pair_has(*pairs[0], h, q_idx, kv_idx), 1.0, 0.0)
                for w, r in pairs[1:]:
                    count = count + torch.where(pair_has(w, r, h, q_idx, kv_idx), 1.0, 0.0)
                return score + torch.log(count)
            self.mask_mod = dilated_mask
            self.score_mod = dilated_score
        else:
            raise ValueError("unknown variant %r (variants: %s)" % (name, ", ".join(VARIANTS)))

    def key(self):
        return (self.name, self.S, self.D, self.B, self.H, self.Hkv)

    def grid_mask(self, torch, b, h):
        """The [S, S] boolean mask of batch entry b, head h."""
        idx = torch.arange(self.S, device="cuda")
        return self.mask_mod(torch.tensor(b, device="cuda"), torch.tensor(h, device="cuda"), idx[:, None], idx[None, :])

    def visible(self, torch):
        """Visible score entries over all batch entries and heads, counted from the mask (the masks
        here do not depend on the head), or the variant's own count (dilated)."""
        if self.entries is not None:
            return self.entries
        per_b = [int(self.grid_mask(torch, b, 0).sum()) for b in (range(self.B) if self.per_batch else (0,))]
        return self.H * (sum(per_b) if self.per_batch else per_b[0] * self.B)

    def sdpa_mask(self, torch):
        """SDPA's boolean attn_mask ([1 or B, 1, S, S]: True = attend), or None for is_causal."""
        if self.name in ("causal", "gqa"):
            return None
        if self.name == "dilated":   # additive: log(pairs that have the key), -inf where none has it
            idx = torch.arange(self.S, device="cuda")
            zero = torch.tensor(0, device="cuda")
            heads = []
            for h in range(self.H):
                s = self.score_mod(torch.zeros((), device="cuda"), zero, torch.tensor(h, device="cuda"), idx[:, None],
                                   idx[None, :])
                heads.append(s.to(torch.bfloat16))
                del s
            return torch.stack(heads)[None]
        if self.per_batch:
            return torch.stack([self.grid_mask(torch, b, 0) for b in range(self.B)])[:, None]
        return self.grid_mask(torch, 0, 0)[None, None]

    def reference(self, torch, q, k, v, heads):
        """float32 attention with this meaning on the given (b, h): [len(heads), S, D]."""
        out = []
        group = self.H // self.Hkv
        idx = torch.arange(self.S, device="cuda")
        for b, h in heads:
            bt, ht = torch.tensor(b, device="cuda"), torch.tensor(h, device="cuda")
            s = (q[b, h].float() @ k[b, h // group].float().T) / math.sqrt(self.D)
            if self.score_mod is not None:
                s = self.score_mod(s, bt, ht, idx[:, None], idx[None, :])
            s = s.masked_fill(~self.mask_mod(bt, ht, idx[:, None], idx[None, :]), float("-inf"))
            out.append(torch.softmax(s, dim=-1) @ v[b, h // group].float())
            del s
        return torch.stack(out)


    def reference_dq(self, torch, q, k, v, do, heads):
        """float32 dq of this meaning on the given (b, h), through autograd: [len(heads), S, D]."""
        out = []
        group = self.H // self.Hkv
        idx = torch.arange(self.S, device="cuda")
        for b, h in heads:
            bt, ht = torch.tensor(b, device="cuda"), torch.tensor(h, device="cuda")
            qf = q[b, h].detach().float().requires_grad_()
            s = (qf @ k[b, h // group].float().T) / math.sqrt(self.D)
            if self.score_mod is not None:
                s = self.score_mod(s, bt, ht, idx[:, None], idx[None, :])
            s = s.masked_fill(~self.mask_mod(bt, ht, idx[:, None], idx[None, :]), float("-inf"))
            o = torch.softmax(s, dim=-1) @ v[b, h // group].float()
            out.append(torch.autograd.grad(o, qf, do[b, h].float())[0])
            del s, o
        return torch.stack(out)


class VariantResults(Results):
    HEADER = "variant,S,D,B,H,Hkv,peer,ms,tflops,rrmse,ok,note"

    def add(self, case, peer, ms, tf, rr, ok, note=""):
        self.rows.append((case.key(), peer, ms, tf, rr, ok, note))
        self.write(case.key(), peer, ms, tf, rr, ok, note)


def raise_recompile_limits(torch):
    """torch.compile recompiles flex_attention for each score_mod / mask_mod and shape; past dynamo's
    recompile limit (8 by default) it would fall back to eager flex_attention, which is no peer."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))


def run_variants(args):
    res = VariantResults(args.csv)
    names = args.variants.split(",")
    for n in names:
        if n not in VARIANTS:
            res.note("peers: unknown variant %r (variants: %s): skipped" % (n, ", ".join(VARIANTS)))
    names = [n for n in VARIANTS if n in names]
    if args.seqs:
        seqs = [int(x) for x in args.seqs.split(",")]
    else:
        seqs = [8192] if args.quick else [2048, 8192]
    D = args.head_dim or 128
    only = set(args.only.split(",")) if args.only else set(VARIANT_PEERS)
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
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001
        flex = create_block_mask = None
        res.note("peers: flex_attention unavailable (%s): no flex rows" % one_line(e))
        only.discard("flex_bf16")
    try:
        raise_recompile_limits(torch)
    except Exception as e:  # noqa: BLE001
        res.note("peers: dynamo's recompile limit not raised (%s): past 8 compiles flex may run eager" % one_line(e))
    res.note("peers: torch %s, %s, triton %s; flex = torch.compile(flex_attention, dynamic=False) with a BlockMask from "
             "create_block_mask (built before the timing); SDPA backend left to PyTorch" % (
                 torch.__version__, torch.cuda.get_device_name(0),
                 triton.__version__ if triton is not None else "not available (%s)" % TRITON_ERROR))
    timer = Timer(torch, args.reps, args.warmup)
    attempts = Attempts(torch, res, only, args.verbose)
    gen = torch.Generator(device="cuda")
    for S in seqs:
        torch.cuda.empty_cache()
        B, H = max(1, TOKENS // S), max(1, WIDTH // D)
        gen.manual_seed(args.seed + S * 7 + D)
        q = torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16, generator=gen)
        for name in names:
            try:
                case = VariantCase(torch, name, S, D, args)
            except ValueError as e:
                res.note("peers: %s S=%d: %s: no peer rows for it" % (name, S, one_line(e)))
                continue
            kk, vv = (k[:, :case.Hkv].contiguous(), v[:, :case.Hkv].contiguous()) if case.Hkv != H else (k, v)
            gqa = case.Hkv != H
            heads = check_heads(B, H)
            try:
                ref = case.reference(torch, q, kk, vv, heads)
                fl = 4.0 * D * case.visible(torch)
            except Exception as e:  # noqa: BLE001
                res.note("peers: %s S=%d: the float32 reference or the mask count failed (%s): no peer rows for it" % (
                    name, S, one_line(e)))
                continue
            line = ["%-14s S=%5d" % (name, S)]

            def record(peer, fn, note=""):
                o = fn()
                torch.cuda.synchronize()
                rr = rel_rmse(torch, take_heads(o, heads), ref)
                del o
                ms = timer.median_ms(fn)
                tf = fl / (ms * 1e-3) / 1e12
                res.add(case, peer, ms, tf, rr, rr <= 1e-2, note)
                line.append("%s %.3f ms %.1f TFLOP/s (rRMSE %.1e)" % (peer, ms, tf, rr))

            def flex_peer():
                bm = create_block_mask(case.mask_mod, case.B if case.per_batch else None, H if case.per_head else None, S, S,
                                       device="cuda")
                t0 = time.time()
                flex(q, kk, vv, score_mod=case.score_mod, block_mask=bm, enable_gqa=gqa)   # compiles
                torch.cuda.synchronize()
                compile_s = time.time() - t0
                record("flex_bf16", lambda: flex(q, kk, vv, score_mod=case.score_mod, block_mask=bm, enable_gqa=gqa),
                       "first call (compile) %.1f s; blocks skipped %.1f%%" % (compile_s, bm.sparsity()))

            def flex_backward_peer():
                # The backward alone: one forward that keeps its graph, then autograd.grad of a fixed dO
                # (retain_graph) timed; dq checked against float32 autograd of the reference's heads.
                bm = create_block_mask(case.mask_mod, case.B if case.per_batch else None, H if case.per_head else None, S, S,
                                       device="cuda")
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, kk, vv))
                t0 = time.time()
                o = flex(qg, kg, vg, score_mod=case.score_mod, block_mask=bm, enable_gqa=gqa)
                do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=gen)
                grads = torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)   # compiles the backward
                torch.cuda.synchronize()
                compile_s = time.time() - t0
                dq_ref = case.reference_dq(torch, q, kk, vv, do, heads)
                rr = rel_rmse(torch, torch.stack([grads[0][b, h] for b, h in heads]).float(), dq_ref)
                del grads
                ms = timer.median_ms(lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True))
                fl_bwd = 2.5 * fl
                tf = fl_bwd / (ms * 1e-3) / 1e12
                res.add(case, "flex_bf16_bwd", ms, tf, rr, rr <= BACKWARD_TOL,
                        "first call (forward + backward compile) %.1f s; blocks skipped %.1f%%; rRMSE of dq" % (compile_s, bm.sparsity()))
                line.append("flex backward %.3f ms %.1f TFLOP/s (dq rRMSE %.1e)" % (ms, tf, rr))
                del o, do, qg, kg, vg

            def sdpa_peer():
                mask = case.sdpa_mask(torch)
                if mask is None:
                    record("sdpa_mask_bf16", lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa),
                           "is_causal=True")
                else:
                    record("sdpa_mask_bf16", lambda: F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask),
                           "boolean attn_mask %s" % "x".join(str(x) for x in mask.shape))

            where = "%s S=%d" % (name, S)
            if args.backward:
                attempts("flex_bf16_bwd", ("flex_bf16_bwd", name), where, "this variant", flex_backward_peer)
                print("  " + "  ".join(line))
                sys.stdout.flush()
                del ref, kk, vv
                continue
            attempts("flex_bf16", ("flex_bf16", name), where, "this variant", flex_peer)
            if name in SDPA_VARIANTS:
                attempts("sdpa_mask_bf16", ("sdpa_mask_bf16", name), where, "this variant", sdpa_peer)
            print("  " + "  ".join(line))
            sys.stdout.flush()
            del ref, kk, vv
    return res


def print_variant_table(res):
    by_case = {}
    for key, peer, ms, tf, rr, ok, note in res.rows:
        by_case.setdefault(key, {})[peer] = (ms, tf, ok)
    print("\n| variant | S | B×H (Hkv) | flex bf16 TFLOP/s (ms) | SDPA mask bf16 TFLOP/s (ms) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (name, S, D, B, H, Hkv), row in by_case.items():
        def cell(p):
            return "%.1f (%.3f)%s" % (row[p][1], row[p][0], "" if row[p][2] else " FAIL") if p in row else "n/a"
        print("| %s | %d | %d×%d (%d) | %s | %s |" % (name, S, B, H, Hkv, cell("flex_bf16"), cell("sdpa_mask_bf16")))
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
    ap.add_argument("--backward", action="store_true", help="SDPA's backward alone (peers: " + ",".join(BACKWARD_PEERS) + ")")
    var = ap.add_argument_group("--variants mode (tilejit bench variants): issue #7's attention variants")
    var.add_argument("--variants", help="comma-separated: " + ",".join(VARIANTS) + " (runs this mode; --only: "
                     + ",".join(VARIANT_PEERS) + ")")
    var.add_argument("--seqs", help="comma-separated S (default 2048,8192; --quick 8192); B = 16384 / S, H = 2048 / D")
    var.add_argument("--window", type=int, default=1024, help="sliding_window: causal, i - j < WINDOW")
    var.add_argument("--segment", type=int, default=2048, help="segment: block-diagonal segments of SEGMENT")
    var.add_argument("--softcap", type=float, default=30.0, help="softcap: CAP * tanh(score / CAP), causal")
    var.add_argument("--gqa-group", type=int, default=4, help="gqa: Hkv = H / GROUP, causal")
    var.add_argument("--prefix-div", type=int, default=4, help="prefix_lm: a prefix of S / DIV in every batch entry")
    var.add_argument("--doc-eighths", default="1,3,2,2",
                     help="documents: document d has length S * EIGHTHS[d] / 8 + SHIFTS[d] (the last: the rest of S)")
    var.add_argument("--doc-shifts", default="37,-90,70,-17", help="documents: see --doc-eighths (they sum to 0)")
    var.add_argument("--block-cell", type=int, default=128, help="block_mask: cells of CELL x CELL (the pattern: "
                     "tools/bench_variants.cpp variant_block_kept)")
    var.add_argument("--dilated", default="2048:1,4096:2,8192:4", help="dilated: LongNet's (segment, rate) pairs W:R,...")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    try:
        eighths, shifts = int_list(args.doc_eighths), int_list(args.doc_shifts)
    except ValueError:
        ap.error("--doc-eighths and --doc-shifts take comma-separated integers")
    if len(eighths) != len(shifts) or len(eighths) < 1 or sum(eighths) != 8 or sum(shifts) != 0:
        ap.error("--doc-eighths (summing to 8) and --doc-shifts (summing to 0) need one entry per document")
    try:
        res = run_variants(args) if args.variants else run_backward(args) if args.backward else run(args)
    except Exception as e:  # noqa: BLE001  (the CSV keeps what finished; say why it stopped)
        traceback.print_exc()
        print("peers: stopped: %s" % one_line(e))
        return 1
    if not args.csv:
        (print_variant_table if args.variants else print_backward_table if args.backward else print_table)(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
