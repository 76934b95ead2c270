#pragma once
// Host-side helpers for the FP8 attention pipeline (kernels/attention_fp8.cpp, kernels/quantize.cpp):
// from bf16/f16 Q, K, V on the GPU to the attention output, quantizing on the way.
//
// Recipes (AttentionFp8Options), all e4m3 with one descale per (b, h) for Q, K and V, P in
// [0, 2^8.75] quantized to e4m3 (exp2 against the running max minus 8; with lazy rescaling the
// max moves only when a block passes it by more than 0.75). Output error against float64
// attention of the unquantized inputs, from a float64 emulation of each recipe (bench/attention/
// accuracy_emulation.py, which moves the max at every block; S = 2048, D = 128, one head, seed 0;
// "outliers": N(0,1) + N(0,10²)·Bernoulli(0.001)):
//
//   recipe                    N(0,1) rel RMSE, cosine   outliers RMSE   QKᵀ work
//   plain (FA3's)             5.3e-2, 0.99858           2.05e-2         1×
//   hadamard                  5.3e-2, 0.99859           1.14e-2         1× (+ rotation pre-pass)
//   q_residual                4.6e-2, 0.99894           1.55e-2         2× (QK head dim 2D)
//   hadamard + q_residual     4.6e-2, 0.99895           0.85e-2         2× (+ rotation pre-pass)
//
// hadamard: Q and K are rotated by the orthonormal Sylvester Hadamard H [D, D] before
//   quantization ((QH)(KH)ᵀ = QKᵀ: softmax is unchanged); an outlier spreads over its row
//   instead of setting the scale for the whole (b, h), which is what helps outlier inputs. No
//   help on N(0,1) (already spread). D must be a power of two. The rotation runs as a SIMT `dot`
//   in each of the quantizer's two passes (2·D² flops per row each, one program per (b, h) like
//   the other quantizers): O(D) more pre-pass work, not yet timed on a GPU.
// q_residual: Q ≈ Q_hi + Q_lo (Q_lo = e4m3 of Q_hi's rounding error, same scale), and
//   attention_fp8 runs on qq = [Q_hi | Q_lo] and kk = [K | K] (QK head dim 2D, V's D): Q is
//   then exact to ~6e-4 and the error left is K's, V's and P's. The QKᵀ dot doubles, so expect
//   ~2/3 of the plain FP8 speed (QKᵀ is half of the FLOPs: 3 units of work instead of 2).
// Per-block (128-row) Q/K scales are not offered: in the same emulation they change nothing on
//   N(0,1) (5.33e-2 both), and with the rotation outlier RMSE moves within noise (1.14e-2 ->
//   1.09e-2 at seed 0, 0.99e-2 -> 1.01e-2 at seed 1 over 4 heads; hadamard + q_residual 0.85e-2 ->
//   0.88e-2). Only the unrotated plain recipe gains on outliers (2.05e-2 -> 1.68e-2 at seed 0,
//   1.74e-2 -> 1.68e-2 at seed 1), less than the rotation gives, and it would need per-block
//   descales in attention_fp8.
// The softmax scale stays 1/sqrt(D) of the original head dim (not of 2D).
#include <cuda.h>

#include <optional>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/tensor.h"

namespace tj::kernels {

struct AttentionFp8Options {
  bool causal = false;                       // top-left aligned
  std::optional<double> softmax_scale;       // default 1/sqrt(D)
  bool quantize = true;                      // false: attention_fp8 on the 16-bit inputs as given (descales 1)
  std::optional<Config> attention_config;    // default: attention_fp8_default_config(...)
  std::optional<TensorView> lse;             // f32 [B, H, Sq] to fill with the row logsumexp
  float o_scale = 1.0f;                      // e4m3 outputs: o = e4m3(O * o_scale)
  // f32 [B, H] to fill with the output's amax per (b, h) (for the next o_scale): max |o| / o_scale
  // of the output as stored (e4m3: rounded to it; a saturated output shows as 448 / o_scale).
  std::optional<TensorView> o_amax;
  // Delayed scaling (the plain recipe only; TransformerEngine's recipe with an amax history of one):
  // Q, K and V take their descales from the amaxes the previous call with this workspace measured,
  // and measure this call's amaxes in the same pass that quantizes, so each is read once instead of
  // twice. The first call with a workspace (or after a change of shape) measures first, as without
  // it. A value past the previous call's amax saturates (to +-448 descale) for that one call. Keep
  // one workspace per layer: its amaxes describe the tensors of the calls made with it.
  bool delayed_scaling = false;
  bool hadamard = false;                     // rotate Q and K by a Hadamard before quantizing (see above)
  bool q_residual = false;                   // Q as e4m3 high + low parts, QK head dim 2D (see above)
  // An attention variant (kernels/attention_variant.h: attention_variant(...)) to run instead of
  // attention_fp8, and its extra input tensors, in order. Must outlive the call.
  const Kernel* kernel = nullptr;
  std::vector<TensorView> inputs;
  CUstream stream = nullptr;
  // The first launch may start before the previous kernel on the stream has finished
  // (LaunchOptions::start_early); that kernel must not write q, k, v or `inputs`. Without quantize
  // that launch is the attention; with the plain recipe's quantize it is the first pre-pass (the
  // attention reads what the quantizers write just before it and starts after them).
  bool start_early = false;
};

// Device scratch of attention_fp8_forward (fp8 copies of q and k -- [.., 2D] with q_residual --,
// Vᵀ, the descales, the Hadamard matrix), reused across calls (reallocated when shapes change).
struct AttentionFp8Workspace {
  std::optional<DeviceTensor> q8, k8, vt8, qd, kd, vd, ones, no_lse, hadamard;
  std::optional<DeviceTensor> q_amax, k_amax, v_amax;   // per-chunk amaxes of the plain recipe
  // Delayed scaling: the amaxes this call measures (swapped with the ones above after each call),
  // and the q / k shapes the amaxes above were measured on (empty: none yet).
  std::optional<DeviceTensor> q_amax_next, k_amax_next, v_amax_next;
  std::vector<int64_t> delayed_q_shape, delayed_k_shape;
};

// o = attention(q, k, v) for device tensors q [B, H, Sq, D], k / v [B, Hkv, Skv, D] (bf16 or
// f16) and o [B, H, Sq, D] (bf16, f16 or e4m3): the Q and K quantizers of the recipe
// (quantize_fp8, quantize_hadamard_fp8, or quantize_residual_fp8 + quantize_duplicate_fp8),
// quantize_transpose_fp8 (v) -- e4m3 with per-(b, h) descales -- then attention_fp8, all
// through tj::launch on opt.stream (the attention itself through the sm_90a tensor-core
// lowering on Hopper).
void attention_fp8_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                           const AttentionFp8Options& opt, AttentionFp8Workspace& ws);

// The config attention_fp8_forward uses by default, the fastest of the harness sweep in
// bench/RESULTS.md (H200, S >= 2k): fp8 D 64: block m 192 (three consumer warpgroups), n 128;
// fp8 D 128: m 128, n 192 (but see below); fp8 D 256 and 16-bit: m 128, n 128 (16-bit D 256:
// n 64); 2 stages. qk_head_dim (2·D with q_residual, at most 256) fits the same blocks. key_block
// (an attention variant's, kernels/attention_variant.h; 0: none) caps the key block where it is a
// valid one (fp8 with more than 4096 keys: 128 for a key_block of 64). fp8 D 128 takes
// query blocks of 64 (two CTAs per SM) where a tile has little work or much per score:
// seq_kv (the keys; 0: unknown) up to 4096 (causal) / 2048, or a key_block of 128 or less (a
// sparse mask, a score_mod: attention_variant_key_block); with more keys, no key_block and
// qk_head_dim <= 128, query blocks of 192 (three consumer warpgroups), key blocks of 96 and 4
// stages. 16-bit D <= 128 with a key_block of 64 (rows that see few keys) takes 64 x 64 tiles, two
// CTAs per SM. fp8_key_block (attention_variant_fp8_key_block; 0: none) replaces key_block for fp8
// inputs of head dim 128 at every length (a window's 64). The H100 measurements behind these choices
// are in the comments of the definition (kernels/attention_fp8_forward.cpp) and, for the window's,
// of sliding_window_variant (kernels/attention_variants.cpp).
Config attention_fp8_default_config(DType in, int64_t head_dim, bool causal, int64_t qk_head_dim = 0,
                                    int64_t key_block = 0, int64_t seq_kv = 0, int64_t fp8_key_block = 0);

// Row chunks per (b, h) the plain recipe's quantizers use (chunk_amax and the chunked quantizers
// in kernels/library.h, blocks "s" / "s2" = 64) for B·H = heads_total and sequence length S.
int64_t attention_fp8_quantize_chunks(int64_t heads_total, int64_t S);

// The config of attention_fp8_forward's quantizer launches (they run SIMT): rows in blocks of 64
// ("s", "s2"); with `rotate`, columns of x·H in blocks of 64 too ("d", "d2"), one stage past
// head dim 128 (a 16-bit rotation's operand tiles on the tensor cores fit shared memory).
Config attention_fp8_quantize_config(bool rotate, int64_t head_dim = 128);

// The configs of quantize_fp8_per_head's launches: chunk_amax's (rows in blocks "s" of 64) and
// the chunked quantizers' (blocks "s2" of 64; `transpose`: quantize_transpose_fp8_chunked's),
// all on eight warps.
Config chunk_amax_config();
Config chunked_quantize_config(bool transpose);

// x [B,H,S,D] -> e4m3 y [B,H,S,D] (transpose: yᵀ [B,H,D,S_pad]) with descale [B,H] f32 = amax /
// 448 per (b, h), over B·H·C programs (chunk_amax, then quantize_fp8_chunked /
// quantize_transpose_fp8_chunked; bit for bit what the one-pass quantizers write). `partial` is
// the chunk amaxes' scratch, grown as needed (never shrunk). Views may be strided.
void quantize_fp8_per_head(const TensorView& x, std::optional<DeviceTensor>& partial, const TensorView& y,
                           const TensorView& descale, bool transpose, const LaunchOptions& lo);
// Its two steps: the chunk amaxes of x into `partial` (grown as above; returns the [B, H, C] view
// of it), then y and the descales from chunk amaxes `chunks` ([B, H, C'] for any C' >= 1: the
// descale is their max, C' the row chunks the quantizer takes; a view may repeat a head's, e.g.
// stride 0, to quantize parts of it with the whole head's descale).
TensorView chunk_amaxes(const TensorView& x, std::optional<DeviceTensor>& partial, const LaunchOptions& lo);
void quantize_with_chunk_amaxes(const TensorView& x, const TensorView& chunks, const TensorView& y, const TensorView& descale,
                                bool transpose, const LaunchOptions& lo);
// y and its transpose yt [B, H, D, S_pad] from one read of x (quantize_fp8_both_chunked, on
// chunked_quantize_config(true)): what quantize_with_chunk_amaxes writes into each, in one launch.
void quantize_both_with_chunk_amaxes(const TensorView& x, const TensorView& chunks, const TensorView& y, const TensorView& yt,
                                     const TensorView& descale, const LaunchOptions& lo);

// Delayed scaling's quantizer: y (transpose: yᵀ [B, H, D, S_pad]) and descale from x and `prev`
// ([B, H, C'] chunk amaxes of an earlier x), x's own chunk amaxes into `next` (grown as
// chunk_amaxes grows `partial`; returns the [B, H, C] view of it): one pass over x.
TensorView quantize_fp8_delayed(const TensorView& x, const TensorView& prev, const TensorView& y, const TensorView& descale,
                                std::optional<DeviceTensor>& next, bool transpose, const LaunchOptions& lo);

// Sylvester's Hadamard matrix of order d, [d, d]: f32 normalized (entries ±1/√d, H·Hᵀ = I), or in a
// 16-bit dtype its signs (±1, exact; the quantizers scale the product by 1/√d and multiply on the
// tensor cores): the rotation the hadamard option passes to the quantizers, in q's dtype. d must
// be a power of two.
HostTensor hadamard_matrix(int64_t d, DType dtype = DType::f32);

}  // namespace tj::kernels
