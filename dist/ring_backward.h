#pragma once
// Ring attention's backward over NCCL (the forward: dist/ring_attention.h). Each rank holds its rows
// of q, k, v, o, dO and the forward's LSE; the K / V shards travel the ring again, each with f32
// accumulators of its dK and dV. At every step a rank runs the fused backward on the chunk pairs of
// the shard it holds (kernels/attention_backward.h: ring_backward_step_launches): its dQ summed in
// place by atomic adds, the shard's dK / dV parts added into the travelling accumulators. After the
// last step the accumulators take one more hop, home to their owner.
//
// Stage 1: a shard moves on once the step that used it has finished (the transfers do not yet
// overlap the next step's kernels), bf16 / f16 only, no window; grouped-query heads (K / V with
// Hkv heads dividing Q's H: each step's per-query-head dK / dV shares summed into the kv head's).
#include <nccl.h>

#include <optional>
#include <vector>

#include "kernels/ring_plan.h"
#include "runtime/memory.h"
#include "runtime/owned_tensor.h"

namespace tj::dist {

struct RingBackwardOptions {
  kernels::RingPlan::Sharding sharding = kernels::RingPlan::Sharding::zigzag;   // as the forward's
  bool causal = false;
  // The forward's sliding window (RingAttentionOptions::window; 0: none): a window pair's dK / dV
  // and dQ by its shifted window variant's backward kernels (kernels/attention_backward.h).
  int64_t window = 0;
  std::optional<double> softmax_scale;   // the forward's; default 1/sqrt(D)
  CUstream stream = nullptr;             // the compute stream
  // Hold the rank's own shard at every step and send nothing: the launches rank local_rank of a
  // ring of local_ranks runs, without communication (`tilejit bench ring`'s single-GPU baseline;
  // the gradients are then not the attention's). comm may be null.
  bool local_only = false;
  int local_ranks = 1, local_rank = 0;
};

struct RingBackwardWorkspace {
  std::optional<DeviceTensor> slot[2];   // bytes: K, V, then dK, dV (f32)
  std::optional<DeviceTensor> delta, lse2, dq_acc, dk_part, dv_part, dq_part;   // dq_part: with a window
  std::optional<runtime::Stream> comm;
  std::vector<runtime::Event> sync;      // per step: computed, arrived
};

// dq, dk, dv = this rank's rows of the gradients of ring attention, given its rows of q, k, v, o,
// dout [B, H, n, D] (bf16 or f16, contiguous) and the forward's lse [B, H, n] f32
// (RingAttentionOptions::lse; natural log); dq / dk / dv [B, H, n, D] of any float dtype. Every
// rank calls it with the same shapes and options. Throws tj::Error before anything is sent for
// inputs that do not fit.
void ring_attention_backward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                             const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                             const TensorView& dv, const RingBackwardOptions& opt, RingBackwardWorkspace& ws);

// Its checks for `ranks` ranks, and the plan.
kernels::RingPlan ring_backward_plan(int64_t ranks, const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& o, const TensorView& dout, const TensorView& lse, const TensorView& dq,
                                     const TensorView& dk, const TensorView& dv, const RingBackwardOptions& opt);

}  // namespace tj::dist
