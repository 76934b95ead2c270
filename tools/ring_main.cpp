// The `tilejit-ring` program (`tilejit bench ring` runs it): ring attention (dist/ring_attention.h)
// and all-to-all attention (dist/ulysses_attention.h) on every GPU of this machine, one process per GPU. Started by a person it is the launcher: it
// takes an NCCL unique id and starts itself once per GPU (--rank r --nccl-id ID, $TILEJIT_DEVICE =
// r), then waits for them; the ranks check the ring against single-GPU attention of the whole
// sequence (--check) or time it (default) with the same launches on one GPU and, non-causal, one
// dense launch of the rank's rows over all keys as baselines, and rank 0 prints the table.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nccl.h>

#include <iostream>

#include "core/error.h"
#include "tools/ring_bench.h"

int main(int argc, char** argv) {
  tj::tools::RingBenchOptions opt;
  CLI::App app{"tilejit-ring: ring attention over NCCL on this machine's GPUs (`tilejit bench ring`)"};
  app.add_option("--gpus", opt.gpus, "ranks, one GPU each (default: every GPU)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);   // the launcher appends its own
  app.add_option("--seq", opt.seqs, "total sequence lengths (default: 131072 262144 524288 1048576; --check: 16384)")
      ->delimiter(',');
  app.add_option("--batch", opt.batch)->capture_default_str();
  app.add_option("--heads", opt.heads)->capture_default_str();
  app.add_option("--kv-heads", opt.kv_heads, "K / V heads (grouped-query attention; default: --heads)");
  app.add_option("--head-dim", opt.head_dim)->capture_default_str();
  app.add_option("--dtype", opt.dtypes, "bf16, fp8 (default both)")->delimiter(',');
  app.add_option("--strategy", opt.strategies, "ring, all-to-all (Ulysses; default both)")->delimiter(',');
  app.add_flag("--causal", opt.causal_only, "causal only (zigzag sharding)");
  app.add_flag("--non-causal", opt.non_causal_only, "non-causal only");
  app.add_option("--dilated", opt.dilated,
                 "SEGMENT:RATE,...: LongNet's dilated attention over the ranks (dist/dilated_ring.h), with --check");
  app.add_flag("--backward", opt.backward, "the ring backward (dist/ring_backward.h): timed, or with --check against one GPU's");
  app.add_option("--window", opt.window, "a causal sliding window of this many keys (ring only; contiguous chunks)");
  app.add_option("--sharding", opt.sharding, "zigzag or contiguous")->capture_default_str();
  app.add_flag("--check", opt.check, "check the ring against single-GPU attention and float64 instead of timing");
  app.add_option("--reps", opt.reps, "timed calls per case (median)")->capture_default_str();
  app.add_option("--warmup", opt.warmup)->capture_default_str();
  app.add_option("--out", opt.out, "also write the markdown table to this file");
  app.add_option("--rank", opt.rank, "(set by the launcher)");
  app.add_option("--nccl-id", opt.nccl_id, "(set by the launcher)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (opt.rank < 0) return tj::tools::ring_launch(opt, std::vector<std::string>(argv, argv + argc));
    return tj::tools::ring_rank_main(opt);
  } catch (const std::exception& e) {
    std::cerr << (opt.rank >= 0 ? fmt::format("tilejit-ring [rank {}]: ", opt.rank) : std::string("tilejit-ring: ")) << e.what()
              << "\n";
    return 1;
  }
}
