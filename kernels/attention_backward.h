#pragma once
// The attention backward, written in the DSL (FlashAttention-2's algorithm) and compiled by the
// generic tensor-core lowering like any user kernel, and its host API over the forward's outputs.
#include <cuda.h>

#include <optional>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"
#include "kernels/attention_variant.h"
#include "kernels/ring_plan.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"

namespace tj::kernels {

// Attention backward (FlashAttention-2's algorithm) in three kernels, all log2-scaled like the
// forward: the forward's lse [B, H, S] is m + log2(l) of each row in the units of s = q.k * scale.
//   attention_bwd_delta: delta[b, h, i] = sum over d of do * o (f32).
//   attention_bwd_dkdv:  per key tile, dk and dv over every query tile.
//   attention_bwd_dq:    per query tile, dq over every key tile.
// Gradients are with respect to q, k and v of the forward (natural-log softmax, scale / log2(e)).
// q, do, lse, delta, dq: [B, H, Sq, ..]; k, v: [B, Hkv, Skv, D] (query head h reads kv head h /
// (H / Hkv)); dk, dv: [B, H, Skv, D], each query head's share (the kv head's when Hkv = H).
const Kernel& attention_bwd_delta();
const Kernel& attention_bwd_dkdv();
const Kernel& attention_bwd_dq();
//   attention_bwd_dkdv_fp8 (q, qt, k, v, do, dot, lse, delta, sq, sk, sv, sdo, dk, dv, scale,
//   causal), attention_bwd_dq_fp8 (q, k, kt, v, do, lse, delta, sq, sk, sv, sdo, dq, scale, causal):
//   the same on e4m3 q, k, v and do, with qt, dot, kt their transposed e4m3 copies [B, H(kv), D,
//   S_pad] (quantize_transpose_fp8's layout: FP8 wgmma reads operands K-major) and descales sq,
//   sdo [B, H] and sk, sv [B, Hkv] f32 (the recipe of bench/attention/backward_emulation.py "e4m3
//   Q K V P dO, e5m2 dS x 2^12": P into dV's product as e4m3 of 2^8 P, dS into dK's and dQ's as
//   e5m2 of 2^12 dS); lse from the FP8 forward's scores (log2 units), delta from the e4m3 dO and O
//   (attention_bwd_prepare_fp8).
const Kernel& attention_bwd_dkdv_fp8();
const Kernel& attention_bwd_dq_fp8();
//   attention_bwd_fused: dk and dv as attention_bwd_dkdv, and dq in the same pass: each key tile
//   adds its share dS . K into dq_acc [B, H, S, D] (f32, zeroed first) by atomic adds, already
//   scaled; dq is dq_acc converted (attention_bwd_dq_convert). The adds' order is not fixed, so
//   dq's last bits vary from run to run (the three-kernel form is bit-reproducible).
const Kernel& attention_bwd_fused();
const Kernel& attention_bwd_dq_convert();
//   attention_bwd_group_sum (part [B, H, S, D] f32, out [B, Hkv, S, D]): grouped-query heads'
//   dk / dv, each kv head's the sum of its H / Hkv query heads' shares, in a fixed order.
const Kernel& attention_bwd_group_sum();
//   attention_bwd_group_add: the same sum added into out (InOut; the ring backward's travelling
//   dK / dV accumulators).
const Kernel& attention_bwd_group_add();

// attention_bwd_prepare (o, do, lse, delta, lse2): delta as attention_bwd_delta, and lse2 = lse ·
// log2(e): the forward's natural-log LSE (attention_fp8's) in the units the kernels above take.
const Kernel& attention_bwd_prepare();
// attention_bwd_prepare_fp8 (o, do, sdo, lse, delta, lse2): the same from the FP8 backward's e4m3
// do and its descales sdo [B, H]: the dP its kernels compute sums to this delta over each row
// (sum over j of P dP = dO8 . O), so dS's rows sum to zero as the exact gradient's do -- a row
// that sees one key gets dS = 0 -- where a delta from the 16-bit dO leaves dO's rounding in every
// dS (bench/attention/backward_emulation.py: 7.5e-2 against 8.2e-2 rel RMSE on causal dQ, 1.2e-1
// against 1.4e-1 on outlier inputs).
const Kernel& attention_bwd_prepare_fp8();

// The backward of attention_variant(v) (kernels/attention_variant.h): dK / dV per key tile and dQ
// per query tile as attention_bwd_dkdv / attention_bwd_dq, with v's hooks traced on the recomputed
// scores (score_mod, then the mask; score_grad gives score_mod's derivative) and the gradient of the
// unmodded score passed on. Arguments: attention_bwd_dkdv's / attention_bwd_dq's, then v's inputs.
// Kernels named v.name + "_bwd_dkdv" / "_bwd_dq". A variant with learnable inputs: the dK / dV
// kernel takes, after its inputs, one f32 [H] gradient per learnable input ("d_" + its name), zeroed
// before it, and adds each program's share into it by an atomic add (the order of those adds, one
// per key tile and head, varies from run to run). Throws tj::Error for a variant without a name,
// with a score_mod but no score_grad, learnable inputs without param_grad (or not among its
// inputs), or one that merges into its output.
struct VariantBackward {
  std::string name;      // the variant's
  size_t inputs = 0;     // its extra input tensors
  size_t learnable = 0;  // of which learnable
  Kernel dkdv, dq;
  // The FP8 backward's (attention_bwd_dkdv_fp8 / _dq_fp8's arguments and recipe, then the inputs;
  // named + "_fp8"): the hooks on the scores from e4m3 Q and K, score_grad on 2^12 dS.
  Kernel dkdv_fp8, dq_fp8;
};
VariantBackward attention_variant_backward(const AttentionVariant& v);

struct AttentionBackwardOptions {
  bool causal = false;                    // as the forward (top-left aligned)
  std::optional<double> softmax_scale;    // the forward's; default 1/sqrt(D)
  // The three kernels (dQ in a kernel of its own: bit-reproducible from run to run), or false:
  // dK, dV and dQ in one pass, dQ summed by atomic adds into an f32 scratch (its last bits vary).
  bool deterministic = true;
  // The FP8 backward (attention_bwd_dkdv_fp8 / _dq_fp8's recipe): q, k, v and dout quantized to
  // e4m3 per (b, h) here (the workspace keeps the copies and the descales: amax = descale · 448,
  // for a later step's scaling), lse the FP8 forward's (attention_fp8_forward on the same q, k, v).
  // Three kernels only (deterministic).
  bool fp8 = false;
  // The backward of a variant's forward (attention_variant_backward(v); attention_variant(v) ran the
  // forward with these extra inputs, in v.inputs' order). Deterministic; with fp8 the variant's FP8
  // kernels (lse the variant's FP8 forward's). `causal` keeps its meaning (the forward's causal
  // flag: causal and v's mask); a variant whose mask is causal runs faster with causal = true too,
  // its loops then stop at the diagonal.
  const VariantBackward* variant = nullptr;
  std::vector<TensorView> variant_inputs;
  // The gradients of the variant's learnable inputs (AttentionVariant::learnable, in that order):
  // contiguous f32 [H] each, written (zeroed, then summed into by atomic adds: the last bits vary
  // from run to run).
  std::vector<TensorView> variant_param_grads;
  CUstream stream = nullptr;
};

// Device scratch of attention_backward, reused across calls.
struct AttentionBackwardWorkspace {
  std::optional<DeviceTensor> delta, lse2, dq_acc;
  std::optional<DeviceTensor> dk_part, dv_part;   // grouped-query heads: per query head, summed per group
  // fp8: the e4m3 copies (qt, kt, dot transposed, [B, H(kv), D, S_pad]), their descales [B, H(kv)]
  // f32, and the quantizers' chunk amaxes.
  std::optional<DeviceTensor> q8, qt8, k8, kt8, v8, do8, dot8, sq, sk, sv, sdo, amax_chunks;
};

// The e4m3 operands of the FP8 backward's kernels (AttentionBackwardOptions::fp8).
struct BackwardFp8Views {
  TensorView q8, qt8, k8, kt8, v8, do8, dot8;
  TensorView sq, sk, sv, sdo;
};

// One launch of the backward: a kernel and its arguments (default configs).
struct BackwardLaunch {
  const Kernel* kernel = nullptr;
  std::vector<Arg> args;
};

// The launches of attention_backward, in order, over the scratch given (delta, lse2 [B, H, Sq] f32;
// dq_acc [B, H, Sq, D] f32, zeroed before them, when not deterministic; with grouped-query heads
// dk_part, dv_part [B, H, Skv, D] f32: each query head's share, summed per group after; with
// opt.fp8 the e4m3 operands, quantized before them). Throws tj::Error for inputs that do not fit
// (see attention_backward).
std::vector<BackwardLaunch> attention_backward_launches(const TensorView& q, const TensorView& k, const TensorView& v,
                                                        const TensorView& o, const TensorView& dout, const TensorView& lse,
                                                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                                        const AttentionBackwardOptions& opt, const TensorView& delta,
                                                        const TensorView& lse2, const std::optional<TensorView>& dq_acc,
                                                        const std::optional<TensorView>& dk_part = std::nullopt,
                                                        const std::optional<TensorView>& dv_part = std::nullopt,
                                                        const std::optional<BackwardFp8Views>& fp8 = std::nullopt);

// dq, dk, dv = the gradients of attention(q, k, v) (softmax scale opt.softmax_scale, causal or
// not) given dout = dL/do, o and lse the forward's outputs (attention_fp8_forward with lse: its
// natural-log row logsumexp). q, o, dout, dq [B, H, Sq, D]; k, v, dk, dv [B, Hkv, Skv, D] (Hkv
// dividing H: grouped-query heads, query head h reading kv head h / (H / Hkv), dk / dv summed over
// each group in a fixed order; Sq and Skv may differ, causal is top-left aligned as the forward);
// q, k, v, o, dout bf16 or f16 (one dtype), lse f32 [B, H, Sq], the gradients of any float dtype
// but fp8; on the GPU, launched on opt.stream.
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionBackwardOptions& opt, AttentionBackwardWorkspace& ws);

// The tensors of one rank in ring attention's backward (dist/ring_backward.h), for
// ring_backward_step_launches.
struct RingBackwardViews {
  TensorView q, dout;            // the rank's rows [B, H, n, D] (n = S / P)
  TensorView lse2, delta;        // [B, H, n] f32: attention_bwd_prepare's, of the rank's rows
  TensorView dq_acc;             // [B, H, n, D] f32: the rank's dQ, summed over the steps (zeroed first)
  TensorView k, v;               // the key / value shard held at this step [B, Hkv, n, D]
  TensorView dk_acc, dv_acc;     // its dK, dV [B, Hkv, n, D] f32, summed as it travels (zeroed at its owner)
  TensorView dk_part, dv_part;   // scratch [B, H, L, D] f32 (L: the plan's chunk rows), per query head
  double scale = 0;              // the softmax scale · log2(e)
  TensorView dq_part = {};       // a plan with a window: scratch like dk_part, for a window launch's dQ
};

// The launches of rank `rank` at step `step` of `plan`: per chunk pair, the fused backward (dK, dV
// of the held chunk into the scratch, dQ added into dq_acc's rows); for a window launch (the rows
// and keys the window reaches) its shifted_window_variant's dK / dV and dQ kernels (dQ through
// dq_part, then added into dq_acc's rows); then the scratch added into the held shard's dk_acc /
// dv_acc (grouped-query heads: each group's sum). Throws tj::Error for a plan with a window without
// dq_part.
std::vector<BackwardLaunch> ring_backward_step_launches(const RingPlan& plan, int64_t rank, int64_t step, const RingBackwardViews& v);

}  // namespace tj::kernels
