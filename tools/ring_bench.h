#pragma once
// `tilejit bench ring` (the tilejit-ring program, tools/ring_main.cpp): the launcher that starts
// one process per GPU, and what each rank runs.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dilated_attention.h"

namespace tj::tools {

struct RingBenchOptions {
  int gpus = 0;                          // 0: every GPU
  std::vector<int64_t> seqs;             // total S
  int64_t batch = 1, heads = 8, kv_heads = 0, head_dim = 128;
  std::vector<std::string> dtypes;       // bf16, fp8
  std::vector<std::string> strategies;   // ring, all-to-all
  bool causal_only = false, non_causal_only = false;
  int64_t window = 0;                    // a causal sliding window (ring only, contiguous chunks)
  std::string dilated;                   // "SEGMENT:RATE,...": dilated attention over the ranks (--check)
  bool backward = false;                 // the ring backward (timed, or --check)
  std::string sharding = "zigzag";
  bool check = false;
  int reps = 3, warmup = 1;
  std::string out;
  int rank = -1;                         // >= 0 in a rank's process
  std::string nccl_id;                   // hex, from the launcher
};

// The options with their defaults filled in (dtypes, sequence lengths, strategies, K / V heads);
// throws tj::Error naming the option that is wrong.
RingBenchOptions resolved(const RingBenchOptions& opt);

// Takes an NCCL unique id and starts `argv` once per GPU (--rank r --nccl-id ID, $TILEJIT_DEVICE
// = r, NCCL_NVLS_ENABLE=0 unless set), waits for every rank; nonzero when one fails.
int ring_launch(const RingBenchOptions& opt, const std::vector<std::string>& argv);
// One rank: joins the communicator and checks or times every case.
int ring_rank_main(const RingBenchOptions& opt);

// "2048:1,8192:2" -> the (segment, rate) pairs; throws tj::Error naming the item that is not
// SEGMENT:RATE.
std::vector<kernels::DilatedPair> parse_dilated(const std::string& spec);

// The NCCL unique id as hex and back (throws tj::Error for text of another length or non-hex).
std::string hex_of(const void* bytes, size_t n);
void bytes_of_hex(const std::string& hex, void* bytes, size_t n);

}  // namespace tj::tools
