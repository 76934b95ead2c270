#pragma once
// tj::launch: trace, compile (or find in the caches) and launch a kernel on the current GPU.
#include <vector>

#include "dsl/kernel.h"
#include "runtime/jit.h"

namespace tj {

// Traces and launches `k` on the current GPU with `args` (device tensors). Without
// options.config: the config `tilejit tune` / autotune::tune() stored for this kernel, GPU
// and shape bucket (autotune/cache.h), else the lowering's untuned default; repeated launches
// of the same specialization cost a hash-map lookup and argument packing
// (autotune/launch_plan.h).
void launch(const Kernel& k, const std::vector<Arg>& args, const LaunchOptions& options = {});

}  // namespace tj
