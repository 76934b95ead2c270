#pragma once
// The kernel library, written in the DSL. Each kernel is traced per specialization (dtypes,
// static shapes, host flags) and compiled on first use.
#include <optional>
#include <string>
#include <vector>

#include "dsl/kernel.h"

namespace tj::kernels {

// out[i] = x[i] + y[i] over a 1-D tensor.
const Kernel& vector_add();

// out[i] = 0 over a 1-D tensor (gradients that kernels then add into by atomic adds).
const Kernel& fill_zeros();

// out[a, b, r, c] = x[a, b, r, c] rounded to out's dtype, over [A, B, rows, cols] (blocks "r" and
// "c"; x may be any strided view: a gather of strided rows into a contiguous tensor).
const Kernel& convert();

// out[a, b, r, c] += x[a, b, r, c] over [A, B, rows, cols] (f32 sums, rounded to out's dtype;
// blocks "r" and "c"; any strided views): partial gradients summed into their accumulator.
const Kernel& accumulate();

// Two partial attentions of the same rows over disjoint keys, merged by their logsumexps (natural
// log; -inf: no keys): o, lse [B, H, S, D] / [B, H, S] (bf16 / f16 / f32 o; f32 lse) become the
// attention over both key sets; o2, lse2 the other part (blocks "s").
const Kernel& merge_attention();

// out[r, :] = softmax(x[r, :]) along the last dim, online max/sum in exp2
// (exp(x) = exp2(x · log2 e)), any number of columns.
const Kernel& softmax();

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w (RMSNorm), f32 math; x, out [rows, cols],
// w [cols].
const Kernel& rmsnorm();

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b (LayerNorm, biased variance), f32 math;
// x, out [rows, cols], w, b [cols].
const Kernel& layernorm();

// o = softmax(q kᵀ · scale) v per (batch, head); q [B, H, Sq, D], k/v [B, H, Skv, D],
// o [B, H, Sq, D]. `scale` already includes log2(e). Causal masks keys after the query
// (aligned at the top-left). A plain tiled loop; tensor-core lowering is the compiler's job.
const Kernel& attention();

// c = (a · bᵀ) · scale_a · scale_b + bias, an FP8 scaled GEMM (kernels/gemm.cpp).
// a [M, K] and b [N, K] e4m3 or e5m2 (K-major: b holds the rows of Bᵀ, as torch._scaled_mm's
// second operand transposed); scale_a f32 [1] (per tensor) or [M] (per row); scale_b f32 [1]
// or [N] (per column); bias f32 [N], or [0] for none; c [M, N] f32, bf16 or f16 (any float).
// fp32 accumulation; the epilogue runs in fp32 and rounds once to c's dtype.
const Kernel& fp8_gemm();

// c = a · bᵀ for a [M, K], b [N, K] of one dtype (bf16, f16, ...), fp32 accumulation,
// c [M, N] of any float dtype.
const Kernel& gemm();

// Scaled FP8 attention forward (FlashAttention-3's recipe; kernels/attention_fp8.cpp): q [B,H,Sq,D],
// k [B,Hkv,Skv,D], fp8: vt [B,Hkv,D,Skv_pad] (V transposed by quantize_transpose_fp8), 16-bit: v
// [B,Hkv,Skv,D]; q/k/v_descale [B,Hkv] f32; o [B,H,Sq,D] (bf16/f16, or e4m3 scaled by o_scale);
// lse [B,H,Sq] f32 (written when with_lse); scale = softmax scale * log2(e). Lowered to the
// TMA + wgmma main loop (codegen/device/hopper_attention.cuh) on sm_90a.
const Kernel& attention_fp8();
// attention_fp8 that merges into its output (AttentionVariant::merge_into_output, no hooks): o and
// lse are read too. The sm_90a lowering recognizes merging variants by this kernel's trace.
const Kernel& attention_fp8_merging();

// FP8 quantization of a [B,H,S,D] tensor (kernels/quantize.cpp): descale [B,H] f32 = amax / fp8_max
// per (b, h), y = fp8(x / descale) [B,H,S,D]; the _transpose variant writes yt [B,H,D,S_pad] (the
// pad past S gets zeros when S_pad - S < the block size of "s2"; keep S_pad = S rounded up to 16).
const Kernel& quantize_fp8();
const Kernel& quantize_transpose_fp8();

// The Q/K quantizers of attention_fp8_forward's hadamard / q_residual options (kernels/quantize.cpp).
// rotation: f32 [D, D] orthonormal (Sylvester's Hadamard from hadamard_matrix in
// kernels/attention_fp8.h), or in x's 16-bit dtype a ±1 matrix (hadamard_matrix(D, dtype)) whose
// product the kernels scale by 1/√D -- a 16-bit product runs on the tensor cores (the generic
// lowering), an f32 one on the SIMT path; descale [B,H] f32 = amax / fp8_max of the values quantized.
//   quantize_hadamard_fp8 (x, rotation, y [B,H,S,D], descale): y = fp8(x·R / descale).
//   quantize_residual_fp8 (x, rotation, y [B,H,S,2,D], descale, rotate): the halves of each
//     [2D] row: hi = fp8(x' / descale), lo = fp8(x' / descale - hi), x' = x·R when `rotate`, else x.
//   quantize_duplicate_fp8 (same arguments): hi in both halves (K for a q_residual Q:
//     [Q_hi | Q_lo]·[K | K]ᵀ = (Q_hi + Q_lo)·Kᵀ).
// Blocks "s"/"s2" (rows of the amax / write pass), "d"/"d2" (columns of x·R, with a rotation).
// The same quantization (bit for bit) with B·H·C programs instead of B·H: chunk_amax (x,
// partial [B,H,C] f32) takes the amax of each of C row chunks (whole tiles of 64 rows; with a
// block "s" that does not divide 64, a chunk's last tile also reads the next chunk's first rows),
// then quantize_fp8_chunked / quantize_transpose_fp8_chunked (x, partial, y or yt, descale) quantize
// chunk by chunk with the descale from all chunks' amaxes.
const Kernel& chunk_amax();
const Kernel& quantize_fp8_chunked();
const Kernel& quantize_transpose_fp8_chunked();
// Both from one read of x: quantize_fp8_both_chunked (x, partial, y, yt, descale) writes what
// quantize_fp8_chunked writes into y and quantize_transpose_fp8_chunked into yt.
const Kernel& quantize_fp8_both_chunked();
// Delayed scaling (TransformerEngine's recipe, an amax history of one): quantize_fp8_delayed /
// quantize_transpose_fp8_delayed (x, prev [B,H,C'] f32, y or yt, descale [B,H], amax_out [B,H,C])
// quantize chunk by chunk with the descale from `prev` (an earlier call's chunk amaxes: their max
// / fp8_max) and write each chunk's own amax into amax_out, reading x once. Values past the
// earlier amax saturate. With prev = this x's chunk amaxes, y equals the chunked quantizers' bit
// for bit.
const Kernel& quantize_fp8_delayed();
const Kernel& quantize_transpose_fp8_delayed();
// head_amax (x [B,H,S,D], amax [B,H] f32, scale): amax[b, h] = max |x[b, h]| * scale -- the
// output amax of an e4m3 attention output (scale = 1 / o_scale), one program per (b, h).
const Kernel& head_amax();
const Kernel& quantize_hadamard_fp8();
const Kernel& quantize_residual_fp8();
const Kernel& quantize_duplicate_fp8();

// A problem to run a library kernel on, as the CLI and tests describe it.
struct Problem {
  DType dtype = DType::f32;                  // input element type
  std::optional<DType> out_dtype;            // default: dtype (bf16 for fp8 inputs)
  std::vector<int64_t> shape;                // empty: the entry's default shape
  bool causal = false;
};

// Every library kernel by name, for the CLI and for tests that compile them all.
struct LibraryEntry {
  std::string name;
  const Kernel& (*get)();
  std::string summary;
  std::vector<int64_t> default_shape;
  // The kernel's arguments for `p`: tensor specs, runtime scalars and host values.
  std::vector<ArgSpec> (*arguments)(const Problem& p);
  double (*flops)(const Problem& p);         // useful floating-point work, for TFLOP/s
};
const std::vector<LibraryEntry>& library();
const LibraryEntry& find(const std::string& name);   // throws tj::Error listing the names

}  // namespace tj::kernels
