#include "autotune/launch.h"

#include "autotune/launch_plan.h"
#include "codegen/lowering.h"
#include "runtime/device.h"

namespace tj {

void launch(const Kernel& k, const std::vector<Arg>& args, const LaunchOptions& options) {
  if (!options.config && options.arch.empty()) {
    // The tuned config from the tuning cache, else the default; after the first launch of a
    // specialization this is one hash-map lookup.
    autotune::LaunchPlan plan =
        autotune::plan_launch(k, args, options.dynamic_shapes, options.start_early || options.next_starts_early);
    if (plan.programs == 0) return;
    launch_compiled(k, *plan.kernel, args, plan.geometry, options);
    return;
  }
  const auto specs = specs_for(k, args, options.dynamic_shapes);
  // (without a config, options.arch is set: the other case took the launch plan above)
  const Config config = options.config ? *options.config : codegen::untuned_config(k.trace(specs), options.arch);
  CompileRequest request;
  request.arch = options.arch;
  request.start_early = options.start_early || options.next_starts_early;
  const CompiledKernel& ck = compile(k, specs, config, request);
  const int64_t programs = count_programs(k, ck, args);
  if (programs == 0) return;
  launch_compiled(k, ck, args, launch_geometry(ck, programs, runtime::current_device().sm_count), options);
}

}  // namespace tj
