#pragma once
// Ring (context-parallel) attention forward over NCCL: each rank holds its rows of Q, K, V and O
// (kernels/ring_plan.h: contiguous or zigzag chunks), the K / V shards travel around the ring
// (ncclSend to rank + 1, ncclRecv from rank - 1) on a communication stream of the workspace's own,
// double-buffered, while the compute stream runs the attention launches of the shard it holds;
// each launch merges its rows into O by their logsumexp in the kernel's epilogue
// (AttentionVariant::merge_into_output), so no pass reads the partial results again.
//
// The application owns the communicator and the compute stream; the communicator's rank r runs
// on tilejit's device ($TILEJIT_DEVICE, runtime/device.h). In FP8 each rank quantizes its own Q, K
// and V once (e4m3, a descale per (b, h) of its shard; V transposed) and the e4m3 K / Vᵀ travel
// with their descales: half the bytes of bf16 on the wire.
#include <nccl.h>

#include <optional>
#include <vector>

#include "kernels/attention_fp8.h"
#include "kernels/ring_plan.h"
#include "runtime/memory.h"
#include "runtime/owned_tensor.h"

namespace tj::dist {

struct RingAttentionOptions {
  kernels::RingPlan::Sharding sharding = kernels::RingPlan::Sharding::zigzag;
  bool causal = false;                      // by global positions (top-left aligned)
  // A causal sliding window of this many keys per row (0: none; needs causal): chunk pairs outside
  // it are skipped, and the ring stops after the last step with a launch (kernels/ring_plan.h), so
  // that those shards are never sent. Contiguous sharding keeps that to 1 + ceil((window - 1) / L)
  // steps for chunks of L rows; zigzag spreads each rank's rows over the sequence.
  int64_t window = 0;
  bool fp8 = false;                         // e4m3 Q, K, V (quantized here) and e4m3 K / Vᵀ on the wire
  std::optional<double> softmax_scale;      // default 1/sqrt(D)
  // The config of every attention launch, instead of the default for a chunk's rows.
  std::optional<Config> attention_config;
  std::optional<TensorView> lse;            // f32 [B, H, n] to fill with the rows' logsumexp (natural log)
  // A bf16 o: the launches merge into a running O in f16 (the workspace's), converted into o at the
  // end. Each merge rounds the running O, and bf16's 8-bit mantissa made 4 ranks' output 1.5x as far
  // from float64 as one GPU's (rel RMSE 3.4e-3 against 2.3e-3, H200); f16 rounds 8x finer. The
  // values of V must then fit f16 (|v| < 65504); false merges in o itself.
  bool f16_running_output = true;
  CUstream stream = nullptr;                // the compute stream; the call returns with its work queued there
  bool record_steps = false;                // time each step with CUDA events (RingAttentionWorkspace::steps)
  // Hold the rank's own shard at every step and send nothing: the launches that rank local_rank of
  // a ring of local_ranks runs, without communication (the single-GPU baseline of `tilejit bench
  // ring`). comm may then be null.
  bool local_only = false;
  int local_ranks = 1, local_rank = 0;
};

// One step of the ring on the compute stream, from CUDA events (record_steps).
struct RingStepTime {
  float step_ms = 0;   // from the end of the previous step to the end of this one's launches
  float wait_ms = 0;   // of it, the compute stream waiting for the shard to arrive
};

// Device scratch reused across calls: the two slots the shards travel in, the running LSE, the
// e4m3 Q and its descales, the communication stream and the events that order the two streams.
struct RingAttentionWorkspace {
  std::optional<DeviceTensor> slot[2];      // bytes: K, V (16-bit) or K8, Vᵀ8, K / V descales (fp8)
  std::optional<DeviceTensor> lse, q8, qd, ones, partial, running;
  std::optional<runtime::Stream> comm;
  std::vector<runtime::Event> sync;         // per step: shard arrived, step computed
  std::vector<runtime::Event> timing;       // per step: start, after the wait, end
  std::vector<RingStepTime> steps;          // of the last call with record_steps (read after it completes)
  // Waits for the last call's events and fills `steps` (record_steps).
  void read_step_times();
};

// o = attention of this rank's query rows q [B, H, n, D] over the whole sequence, whose keys and
// values are spread over the communicator's ranks as k, v [B, Hkv, n, D] here (n = S / P rows of
// each: the rank's chunks of the plan, one after another); q, k, v, o bf16 or f16, contiguous, o
// like q. Every rank calls it with the same shapes and options. Throws tj::Error for shapes that
// do not fit (rows not splitting into the plan's chunks, fp8 chunks not a multiple of 16 rows,
// a head count not a multiple of Hkv, ...) before anything is sent.
void ring_attention_forward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                            const RingAttentionOptions& opt, RingAttentionWorkspace& ws);

// The checks ring_attention_forward makes before anything runs (for `ranks` ranks), and the plan
// of the whole sequence (S = ranks · n).
kernels::RingPlan ring_attention_plan(int64_t ranks, const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& o, const RingAttentionOptions& opt);

// Scores computed per rank of a call (causal chunks count L (L + 1) / 2 per head), times 4·D
// flops per score: the useful work of ring_attention_forward on rank r.
double ring_attention_flops(const kernels::RingPlan& plan, int64_t rank, int64_t batch_heads, int64_t head_dim);

}  // namespace tj::dist
