#pragma once
// All-to-all (Ulysses, DeepSpeed's) context-parallel attention over NCCL: each rank holds its rows
// of every head (kernels/ring_plan.h's sharding, as ring attention takes them); one all-to-all
// gives each rank all S rows of H / P heads, it runs single-GPU attention on them
// (attention_fp8_forward: bf16, or FP8 quantized there with a descale per (b, h) of the whole
// sequence), and a second all-to-all returns each rank its rows of every head. Each (peer, head,
// chunk) block moves by one ncclSend / ncclRecv straight into its place: no packing copies.
//
// Against the ring (dist/ring_attention.h): no partial results to merge and one launch per call,
// but every rank must hold the whole sequence of H / P heads, the heads must split over the ranks,
// and the transfers do not overlap the attention (the compute stream carries both).
#include <nccl.h>

#include <optional>

#include "kernels/attention_fp8.h"
#include "kernels/ring_plan.h"
#include "runtime/owned_tensor.h"

namespace tj::dist {

struct UlyssesAttentionOptions {
  kernels::RingPlan::Sharding sharding = kernels::RingPlan::Sharding::contiguous;   // the rows each rank holds
  bool causal = false;
  bool fp8 = false;                         // quantize after the gather (bf16 on the wire)
  std::optional<double> softmax_scale;      // default 1/sqrt(D)
  std::optional<Config> attention_config;
  CUstream stream = nullptr;                // compute and communication
};

struct UlyssesAttentionWorkspace {
  std::optional<DeviceTensor> q, k, v, o;   // [B, H / P, S, D]: this rank's heads, every row
  kernels::AttentionFp8Workspace attention;
};

// o = attention of this rank's rows q [B, H, n, D] over the whole sequence (n = S / P; k, v [B,
// Hkv, n, D]; bf16 or f16, contiguous, o like q). H and Hkv must be multiples of the ranks' count.
// Throws tj::Error before anything is sent for shapes that do not fit.
void ulysses_attention_forward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& o, const UlyssesAttentionOptions& opt, UlyssesAttentionWorkspace& ws);

// Its checks for `ranks` ranks, and the plan of the rows.
kernels::RingPlan ulysses_attention_plan(int64_t ranks, const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& o, const UlyssesAttentionOptions& opt);

}  // namespace tj::dist
