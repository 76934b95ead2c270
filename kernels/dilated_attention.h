#pragma once
// Dilated attention (LongNet, Ding et al. 2023), as used by dilated-attention-pytorch: for every
// (segment length w, dilation rate r) pair, the sequence is cut into segments of w positions and
// each segment keeps every r-th position, starting at offset h mod r for head h; attention runs
// inside each sparse segment; the pairs' outputs are mixed with weights proportional to their
// softmax denominators (exp of their logsumexp), which is softmax over the union of their keys.
//
// Written as user code on the attention variants (kernels/attention_variant.h): the sparse
// positions of one (pair, offset) are a strided view of q, k, v and o (rows j, j + r, ...; heads
// j, j + r, ...), plain attention where those rows are one segment or (rate 1) split into whole
// ones, each then a head of its own (dilated_segments_as_heads), else a block-diagonal mask of
// w / r on that view (segment_variant),
// and the mix in the attentions' epilogues: a pair of rate 1 (if any) writes o and a running
// logsumexp, and each other pair merges its rows into them (AttentionVariant::merge_into_output),
// so no pass reads the pairs' outputs again; each launch after the first starts while the
// previous one ends (LaunchOptions::start_early). Runs in bf16 / f16 or FP8 (dilated_quantize quantizes Q, K and V once where S allows,
// else attention_fp8_forward's pipeline quantizes each view).
#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "runtime/owned_tensor.h"

namespace tj::kernels {

struct DilatedPair {
  int64_t segment;   // w: positions per segment (the last one may be shorter)
  int64_t rate;      // r: every r-th position of a segment; divides w and the number of heads
};

struct DilatedOptions {
  std::vector<DilatedPair> pairs;   // e.g. {{2048, 1}, {4096, 2}, {8192, 4}}
  bool fp8 = false;                 // quantize the views to e4m3 (attention_fp8_forward)
  bool causal = false;              // causal inside each segment
  CUstream stream = nullptr;
  // The config of every (pair, offset) attention, instead of the defaults for its rows
  // (attention_variant_default_config of its segment variant; in fp8 the pair that writes, of
  // rate 1, adds knob attn_lse_e4m3_sums).
  std::optional<Config> attention_config;
};

// The e4m3 inputs of dilated attention, quantized once (dilated_quantize): Q and K whole with a
// descale per (b, h); V per pair transposed so that each offset's keys lie together (Vᵀ [B, H,
// D, S], offset j's keys j, j + r, ... in columns [j·S/r, (j+1)·S/r)) with a descale per (offset,
// b, h); a pair of rate 1 whose segments (w a multiple of 16) cut S into several whole ones,
// segment by segment (Vᵀ [B, H, S/w, D, w], a descale per (b, h, segment)), so that its segments
// run as heads. Every (pair, offset) attention then reads strided views of these.
struct DilatedFp8Inputs {
  std::optional<DeviceTensor> q8, k8, qd, kd;   // [B, H, S, D] e4m3; [B, H] f32
  std::vector<DeviceTensor> vt8, vd;           // per pair: [B, H, D, S] e4m3; [r, B, H] f32 (or as above)
  std::optional<DeviceTensor> partial;         // the quantizers' scratch
};

struct DilatedWorkspace {
  std::optional<DeviceTensor> lse;                 // [B, H, S] f32: the running logsumexp
  AttentionFp8Workspace attention;
  DilatedFp8Inputs fp8;                            // dilated_attention_forward's quantized inputs
};

// o = dilated attention of q, k, v: [B, H, S, D] device tensors (bf16 or f16), o like q.
// Throws tj::Error for pairs that do not fit (r not dividing w or H, mismatched shapes).
void dilated_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                               const DilatedOptions& opt, DilatedWorkspace& ws);

// The gradients of dilated attention (16-bit): dq, dk, dv [B, H, S, D] (any float dtype) of a loss
// L given dout = dL/do, from q, k, v, the forward's o and its running logsumexp lse (DilatedWorkspace::lse,
// f32 [B, H, S], natural log; opt.pairs and opt.causal as in the forward). The mix by logsumexps is
// softmax over every pair's keys at once, so each pair's part of the gradient is the plain
// backward on its views with the final o's delta and lse: per (pair, offset) the backward of its
// segment variant (kernels/attention_backward.h; the compiler bounds each loop to its segment),
// summed over the pairs in f32 scratch, then written out. Throws tj::Error for pairs or tensors that
// do not fit (as the forward), fp8, or an lse of another shape.
struct DilatedBackwardWorkspace {
  std::optional<DeviceTensor> delta, lse2, acc, part;   // [B, H, S], [B, H, S], [3, B, H, S, D] f32 x 2
};
void dilated_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const DilatedOptions& opt, DilatedBackwardWorkspace& ws);
// Its launches over the scratch given (delta, lse2 [B, H, S] f32; acc and part [3, B, H, S, D] f32:
// dq, dk, dv's sums and one (pair, offset)'s share), in order.
std::vector<BackwardLaunch> dilated_backward_launches(const TensorView& q, const TensorView& k, const TensorView& v,
                                                      const TensorView& o, const TensorView& dout, const TensorView& lse,
                                                      const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                                      const DilatedOptions& opt, const TensorView& delta, const TensorView& lse2,
                                                      const TensorView& acc, const TensorView& part);

// Whether the quantize-once FP8 path fits S: every rate divides S, and S / r is a multiple of 16
// (each offset's Vᵀ columns start 16-byte aligned for TMA). Otherwise fp8 quantizes each
// (pair, offset) view on its own (attention_fp8_forward's pipeline).
bool dilated_fp8_quantize_once_fits(int64_t S, const std::vector<DilatedPair>& pairs);

// The quantize-once FP8 path in two steps (dilated_attention_forward with fp8 runs both when
// dilated_fp8_quantize_once_fits): quantize q, k, v ([B, H, S, D] bf16 / f16) into `in`, then the
// attentions and the mix from `in` (o [B, H, S, D] bf16 / f16). Throws tj::Error when S does not
// fit (see above) or the shapes differ.
void dilated_quantize(const TensorView& q, const TensorView& k, const TensorView& v, const std::vector<DilatedPair>& pairs,
                      DilatedFp8Inputs& in, CUstream stream = nullptr);
void dilated_attention_fp8(const DilatedFp8Inputs& in, const TensorView& o, const DilatedOptions& opt, DilatedWorkspace& ws);

// An offset's view [B, H', ...] whose rows (dim rows_dim >= 2, of a multiple of `count`) are
// `count` whole segments, as a view [B·H', count, ...] with segment s of (b, a) at (b·H' + a, s):
// plain attention then runs every segment as a head of its own, without a mask. (The tensor maps
// read its first two dims as one only where H' is all the heads: rate 1.) A view without rows
// (rows_dim -1: a descale per (b, h)) repeats for every segment (stride 0). nullopt where b's
// stride is not H' times a's (B > 1), the rows do not split so, or rows_dim names no dim past
// the heads.
std::optional<TensorView> dilated_segments_as_heads(const TensorView& offset_view, int rows_dim, int64_t count);

}  // namespace tj::kernels
