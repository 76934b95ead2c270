#pragma once
// What tj::launch uses when no config is given: the tuned config from the tuning cache,
// else the default, compiled and loaded once per (kernel, argument specialization, shapes).
//
// The hot path is cheap on purpose: after the first launch of a specialization, plan_launch
// builds a compact byte key from the arguments (the kernel's id, each argument's kind,
// dtype, shape and host value; no tracing, no IR hashing, no JSON) and finds the compiled
// kernel and its grid in a hash map.
#include <cstdint>
#include <vector>

#include "runtime/jit.h"

namespace tj::autotune {

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
