#pragma once
// Kernels written as a user would write them: plain DSL loop nests in files of their own, with
// no recognition by the compiler (the library's attention_fp8 and gemm are recognized whole;
// these are not). `bench/dsl` times them against the library's fast paths and torch, and the
// tests check them against the CPU reference executor.
#include "dsl/kernel.h"

namespace tj::examples {

// c = gelu(a . b + bias) with a [M, K], bias [N] and b stored [K, N] (b_kn) or [N, K] (loaded
// and transposed). GELU in its tanh form.
const Kernel& gemm_bias_gelu(bool b_kn);

// c[z] = a[z] . b[z]^T for z over a batch: a [Z, M, K], b [Z, N, K], c [Z, M, N].
const Kernel& batched_gemm();

// y = silu(x . wg^T) * (x . wu^T): x [M, K], wg and wu [N, K]; two accumulators in one loop.
const Kernel& swiglu();

// The attention kernel of README.md, as printed there: q, k, v [B, H, S, D], online softmax in
// exp2 (scale has log2(e) folded in), causal or not.
const Kernel& readme_attention();

// The same with V stored transposed, vt [B, H, D, S] (as the library's FP8 quantizer writes it):
// for e4m3 the P.V dot's b operand is then K-major as stored, which wgmma's fp8 operands need.
const Kernel& readme_attention_vt();

// Sliding-window attention: the README attention, causal, each query seeing its `window` latest
// keys (kv <= q && q - kv < window). Its key loop runs from the first key tile, as written; the
// compiler bounds it to the tiles the mask keeps (codegen/mask_bounds.h). A row's first tiles may
// hold none of its keys, so the running max is guarded where it is still -inf.
const Kernel& window_attention();

// Attention with a per-head sink logit in the softmax denominator (gpt-oss style): sinks [H] in
// log2 units, an extra key of zero value that every query sees.
const Kernel& sink_attention();

// Attention whose values have their own head dim (MLA: q, k [B, H, S, Dqk], v [B, H, S, Dv]).
const Kernel& mla_attention();

// The attention backward written in the DSL (attention_bwd_dq, attention_bwd_dkdv, ...) is the
// library's: kernels/attention_backward.h.

// c = a . b^T with K split over programs: a [M, K], b [N, K], c [M, N] f32; program (m, n, s)
// takes K's tile s and adds its partial product into c by atomic adds (c zeroed first).
const Kernel& splitk_gemm();

// A mixture-of-experts grouped GEMM: y[r] = x[r] . w[g]^T for the rows r of group g, which are
// offs[g] .. offs[g + 1] - 1 (offs [G + 1], i64, on the GPU like the tokens: the row ranges are
// device scalars, read by each program). x [T, K], w [G, N, K], y [T, N]; one program per
// (group, column tile), looping over its group's row tiles; a tile's rows past its group's end
// are not stored.
const Kernel& grouped_gemm();

// Variable-length attention over packed sequences (FlashAttention's varlen layout): q [Tq, H, D],
// k / v [Tk, Hkv, D] hold the batch's sequences one after another; cu_q / cu_k [B + 1] (i64, on the
// GPU, ascending) say where each starts (sequence b: rows cu[b] .. cu[b + 1] - 1); o [Tq, H, D]
// (Hkv divides H). One program per (sequence, head), looping over the sequence's query tiles (the
// row ranges are device scalars, as grouped_gemm's). causal: a query sees the keys of its own
// sequence up to its own position (top-left per sequence).
const Kernel& attention_varlen();

}  // namespace tj::examples
