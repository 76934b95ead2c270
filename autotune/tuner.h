#pragma once
// The autotuner: finds the fastest correct Config of a kernel for one problem on this GPU
// and remembers it (autotune/cache.h), so that tj::launch uses it from then on.
//
//   auto r = tj::autotune::tune(tj::kernels::attention(), specs, {.effort = Effort::full});
//   r.best.to_json();   // also stored: the next tj::launch of that shape bucket uses it
//
// Pipeline: the space comes from the traced kernel (autotune/space.h); a search strategy
// (autotune/search.h) proposes batches of candidates; each candidate is generated (candidates
// whose generated CUDA is identical to an earlier one's are not compiled or run again, e.g.
// num_stages on a kernel without a pipeline), rejected before compiling when it exceeds
// the device's threads or shared memory, compiled with NVRTC on a host thread pool (the
// CUBINs land in the disk cache) while the GPU worker benchmarks the candidates compiled
// before; the worker (autotune/worker.h, a child process) rejects candidates whose registers
// or shared memory exceed the device without launching them, checks each output against
// the default config's with a dtype-aware tolerance, times it with CUDA events (warm-up,
// median of repeats, argument copies rotated when they fit in L2) and stops hopeless
// candidates early. A candidate that faults or hangs kills only the worker; the tuner marks
// it and starts a fresh worker for the rest.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autotune/cache.h"
#include "dsl/config.h"
#include "autotune/search.h"
#include "autotune/space.h"
#include "dsl/kernel.h"

namespace tj::autotune {

// none: the default config, no GPU work; quick: a small search (exhaustive up to 48
// points) with a 20 s budget; full: exhaustive up to 128 points, else pattern search, with
// a 50 s budget; exhaustive: every point, no budget (to validate the others).
enum class Effort : uint8_t { none, quick, full, exhaustive };
std::string_view name(Effort e);
std::optional<Effort> effort_from_name(std::string_view s);

struct Candidate {
  enum class Status : uint8_t {
    ok,             // measured; output matches the reference
    invalid,        // the code generator rejects the config (tile too large, ...)
    pruned,         // exceeds the device (threads, registers, shared memory): never launched
    compile_error,  // NVRTC failed
    wrong,          // output differs from the default config's beyond the tolerance
    fault,          // faulted (illegal address, launch failure, worker crash)
    timeout,        // did not finish within the timeout (hang)
    hopeless,       // stopped early: more than 3x slower than the best so far
    duplicate,      // generated the same code as an earlier candidate (its result is shared)
    skipped,        // the time budget ran out first
    error,          // anything else (e.g. a CUBIN the driver rejects)
  };
  int id = 0;
  Config config;
  Status status = Status::skipped;
  double ms = kFailed;           // median time per launch (hopeless: the estimate when stopped)
  std::string detail;            // why it was rejected / what it matched
  double compile_ms = 0;         // NVRTC time (0 when cached)
  int registers = 0;             // per thread
  int spill_bytes = 0;
  bool reference = false;        // the default config, whose output the others are checked against
  bool in_space = true;          // false for extra candidates and a reference outside the space
  int duplicate_of = -1;
};
std::string_view name(Candidate::Status s);

struct TuneOptions {
  Effort effort = Effort::full;
  bool dynamic_shapes = false;          // tune the kernel launch() compiles with dynamic_shapes
  double time_budget_s = 0;             // 0: quick 20 s, full 50 s, exhaustive unlimited
  double candidate_timeout_s = 30;      // longest a candidate may take in the worker (hang detection)
  int compile_threads = 0;              // 0: hardware threads - 1
  int repeats = 0;                      // timed samples per candidate; 0: quick 5, full 10
  double early_stop = 3.0;              // stop candidates slower than this x the best so far
  bool isolate = true;                  // benchmark in a worker process (fault isolation)
  std::string worker_executable;        // "": find_worker_executable()
  bool use_cache = true;                // a cached winner is returned without tuning
  bool store = true;                    // store the winner in the tuning cache
  std::string cache_file;               // "": TuningCache::default_path()
  bool progress = true;                 // progress line on stderr
  double flops = 0;                     // the problem's useful work, for TFLOP/s in the progress line
  std::vector<Config> extra_candidates; // evaluated too (hand-written configs; tests: knob "__fault")
  SpaceOptions space;                   // .arch is set from the GPU
  std::optional<Strategy> strategy;     // override the effort's strategy
  uint64_t seed = 1;
  // Called after each finished candidate (progress, tests).
  std::function<void(const Candidate&)> on_candidate;
};

struct TuneResult {
  Config best;
  double best_ms = kFailed;
  Config reference_config;              // the default config
  double reference_ms = kFailed;
  std::vector<Candidate> candidates;    // every candidate, in the order they were created
  TuningKey key;
  DeviceIdentity device;
  std::string space;                    // ConfigSpace::describe()
  uint64_t space_size = 0;
  Strategy strategy = Strategy::exhaustive;
  bool from_cache = false;              // the winner came from the tuning cache; nothing ran
  bool stored = false;
  double seconds = 0;                   // wall time
  double compile_seconds = 0;           // NVRTC time summed over candidates
  int nvrtc_compiles = 0;
  int worker_starts = 0;                // 1 + restarts after faults/hangs
  bool isolated = true;
  std::vector<std::string> notes;       // warnings for the user

  // Candidates with status ok, fastest first.
  std::vector<const Candidate*> ranking() const;
};

// Tunes `k` for the problem `specs` describes (concrete shapes: every tensor dim >= 0).
// Throws tj::Error when no GPU worker can run, or when neither the default config nor any
// candidate works.
TuneResult tune(const Kernel& k, const std::vector<ArgSpec>& specs, const TuneOptions& options = {});

// The output tolerance of a dtype, relative to the largest reference magnitude: f32 1e-4,
// f16 4e-3, bf16 2e-2, e4m3 0.13 and e5m2 0.26 (one rounding step: a different
// accumulation order legitimately moves an fp8 output by one step), integers 0. The tuner
// uses at least the e4m3 tolerance for every output of a kernel with fp8 inputs (they
// quantize intermediate values too, e.g. attention's P, at points that depend on the tiling).
double output_tolerance(DType out);

}  // namespace tj::autotune
