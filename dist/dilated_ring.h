#pragma once
// LongNet's dilated attention (kernels/dilated_attention.h) over NCCL, with the sequence in
// contiguous shards of n rows per rank (rank r holds rows [r·n, (r + 1)·n)). A (segment w, rate r)
// pair whose segments fit a shard (n a multiple of w) is local: each rank runs it on its own rows.
// A pair whose segments span g = w / n shards runs, for each head offset j of the rate, ring
// attention (dist/ring_attention.h) over the g ranks of each segment on the sparse rows (rows j,
// j + r, ... of heads j, j + r, ...: 1 / r of the rows and heads, gathered into contiguous copies;
// causal within the segment by the ring's contiguous plan), and merges the result into the running
// output by the two logsumexps (kernels/library.h: merge_attention). The pairs mix as on one GPU:
// softmax over the union of their keys.
#include <nccl.h>

#include <map>
#include <optional>
#include <vector>

#include "dist/ring_attention.h"
#include "kernels/dilated_attention.h"

namespace tj::dist {

struct DilatedRingOptions {
  std::vector<kernels::DilatedPair> pairs;   // e.g. {{2048, 1}, {8192, 2}, {65536, 4}}
  bool causal = false;                       // causal inside each segment
  bool fp8 = false;                          // e4m3 attention (local pairs: dilated's FP8 path; spanning pairs: the ring's)
  CUstream stream = nullptr;
};

struct DilatedRingWorkspace {
  kernels::DilatedWorkspace local;           // the local pairs, and the running LSE [B, H, n]
  RingAttentionWorkspace ring;
  std::optional<DeviceTensor> q, k, v, o, lse;   // one offset's sparse rows, contiguous
  std::map<int64_t, ncclComm_t> groups;      // the communicators of g ranks' segments (ncclCommSplit)
  DilatedRingWorkspace() = default;
  DilatedRingWorkspace(const DilatedRingWorkspace&) = delete;
  DilatedRingWorkspace& operator=(const DilatedRingWorkspace&) = delete;
  ~DilatedRingWorkspace();                   // destroys the group communicators
};

// o = dilated attention of this rank's rows q, k, v [B, H, n, D] (bf16 / f16, contiguous; o like
// q) over the whole sequence of P·n rows. Every rank calls it with the same shapes and options.
// Throws tj::Error before anything is sent when a pair's segment neither divides n nor is a
// multiple of it, or its rate does not divide n (and the checks of dilated_attention_forward).
void dilated_ring_attention_forward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& o, const DilatedRingOptions& opt, DilatedRingWorkspace& ws);

// Its checks for `ranks` ranks; returns which pairs span shards (true) and which are local.
std::vector<bool> dilated_ring_spanning(int64_t ranks, const TensorView& q, const std::vector<kernels::DilatedPair>& pairs);

}  // namespace tj::dist
