#pragma once
// What tj::launch uses when no config is given: the tuned config from the tuning cache,
// else the default, compiled and loaded once per (kernel, argument specialization, shapes).
//
// The hot path is cheap on purpose: after the first launch of a specialization, plan_launch
// builds a compact byte key from the arguments (kernel address, each argument's kind,
// dtype, shape and host value; no tracing, no IR hashing, no JSON) and finds the compiled
// kernel and its grid in a hash map.
#include <cstdint>
#include <vector>

#include "runtime/jit.h"

namespace tj::autotune {

// How a compiled kernel is launched (the one place tj::launch and the tuner's benchmarks
// agree on): one block per program on gridDim.x (persistent kernels: at most
// sm_count * blocks_per_sm blocks, and the program count is passed as a last `long long`
// argument), rounded up to a multiple of the cluster size; num_warps * 32 threads; the
// generated kernel's dynamic shared memory; its cluster shape.
struct LaunchGeometry {
  runtime::Dim3 grid;
  runtime::Dim3 block;
  runtime::Dim3 cluster;
  size_t dynamic_smem = 0;
  int64_t programs = 0;
  bool persistent = false;                  // pass `programs` after the TMA descriptors
};
// Throws tj::Error when `programs` does not fit one launch.
LaunchGeometry launch_geometry(const CompiledKernel& ck, int64_t programs, int sm_count);

struct LaunchPlan {
  const CompiledKernel* kernel = nullptr;   // loaded
  int64_t programs = 0;                     // 0: nothing to launch
  LaunchGeometry geometry;
  bool tuned = false;                       // the config came from the tuning cache
};

// The plan for launching `k` with `args` (device tensors) on the current GPU without an
// explicit config; `start_early`: its kernel compiled for early starts (CompileRequest::start_early),
// a plan of its own. Throws like specs_for/compile for bad arguments.
LaunchPlan plan_launch(const Kernel& k, const std::vector<Arg>& args, bool dynamic_shapes, bool start_early = false);

// Forgets every plan (the next launch of each specialization looks up the tuning cache
// again). Storing a tuning result in this process does this automatically.
void clear_launch_plans();

// Number of plans built (misses of the hot path), for tests.
uint64_t launch_plan_misses();

}  // namespace tj::autotune
