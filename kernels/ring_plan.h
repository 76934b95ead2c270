#pragma once
// The plan of ring (context-parallel) attention over P ranks, host arithmetic only: which query and
// key rows each rank holds, which key shard it has at each step of the ring, and the attention
// launches of each step. The transport (NCCL) and the launches read this plan; tests check it
// against attention over the whole sequence.
//
// The sequence of S rows is cut into chunks of equal length L:
//   contiguous: P chunks, rank r holds chunk r;
//   zigzag:     2P chunks, rank r holds chunks r and 2P - 1 - r (so that causal work balances: each
//               rank holds one early and one late chunk).
// Every rank holds the same query and key rows (self-attention). Step s = 0 .. P - 1: rank r holds
// the key / value shard of rank (r - s) mod P (step 0 its own; each step passes the shard on to
// rank r + 1). At each step a rank computes, for each pair (its query chunk, the held key chunk),
// full attention, causal attention (the same chunk: the diagonal) or nothing (a key chunk after the
// query chunk, causal), and merges the result into its output by the rows' logsumexp
// (AttentionVariant::merge_into_output); the order of the merges does not change the result.
//
// A sliding window (causal: key j visible from row i when 0 <= i - j < window) makes a chunk pair a
// `window` launch where the window cuts it (its mask shifted by the chunks' offset `delta`), full
// where every key lies inside, and skips pairs entirely outside; a ring then needs only the first
// steps() steps (contiguous chunks of L rows: 1 + ceil((window - 1) / L)), and the shards past
// them are neither sent nor computed.
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/kernel.h"

namespace tj::kernels {

struct RingPlan {
  enum class Sharding { contiguous, zigzag };
  enum class Mode { full, causal, window };

  // One attention launch of a step: query chunk `q_chunk` of the rank's own (0 or 1: its first or
  // second chunk) against chunk `kv_chunk` of the key shard it holds.
  struct Launch {
    int q_chunk = 0, kv_chunk = 0;
    Mode mode = Mode::full;
    // window: the rows of the pair that the window reaches (query rows [q_begin, q_end) of the
    // query chunk, keys [kv_begin, kv_end) of the key chunk; kv_begin a multiple of 16 for fp8's
    // Vᵀ columns), and their offset: the first query row's position minus the first key's.
    int64_t q_begin = 0, q_end = 0, kv_begin = 0, kv_end = 0;
    int64_t delta = 0;
  };

  int64_t ranks = 0, seq = 0;
  Sharding sharding = Sharding::contiguous;
  bool causal = false;
  int64_t window = 0;   // a causal sliding window of this many keys per row (0: none)

  // Throws tj::Error when `seq` is not a multiple of the chunks' count (P, or 2P zigzag), ranks <
  // 1, or a window is negative or set without causal.
  RingPlan(int64_t ranks, int64_t seq, Sharding sharding, bool causal, int64_t window = 0);

  int chunks_per_rank() const { return sharding == Sharding::zigzag ? 2 : 1; }
  int64_t chunk_rows() const { return seq / (ranks * chunks_per_rank()); }
  // The global chunk index of rank r's local chunk c.
  int64_t chunk_of(int64_t rank, int c) const;
  // The global row of rank r's local row i (its chunks one after another).
  int64_t global_row(int64_t rank, int64_t i) const;
  // The rank whose key / value shard rank r holds at step s.
  int64_t kv_owner(int64_t rank, int64_t step) const;
  // The launches rank r runs at step s (none: nothing of that shard is visible to its queries); at
  // step 0 each query chunk's first launch is its diagonal pair, which covers all its rows.
  std::vector<Launch> launches(int64_t rank, int64_t step) const;
  // The steps with a launch on some rank, from the first: the ring stops after them.
  int64_t steps() const;
  // Score entries rank r computes over the whole ring (a causal chunk counts L (L + 1) / 2, a
  // window launch its visible entries): the load balance of the sharding.
  int64_t work(int64_t rank) const;
  std::string describe() const;
};

// The kernel of a launch: attention_fp8 where it writes O and the LSE (the first launch of a query
// chunk), attention_fp8_merging where it merges into them; a window launch the
// shifted_window_variant of its delta (kernels/attention_variants.h), built once per (window,
// delta, merging) and kept. Its arguments are attention_fp8's, with `causal` = (mode == causal).
const Kernel& ring_launch_kernel(const RingPlan& plan, const RingPlan::Launch& launch, bool merging);

}  // namespace tj::kernels
