#pragma once
// Turning command-line options into a library kernel, its arguments and a config.
#include <random>
#include <vector>

#include "dsl/config.h"
#include "kernels/library.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"
#include "tools/commands.h"

namespace tj::tools {

struct ResolvedProblem {
  const kernels::LibraryEntry* entry = nullptr;
  kernels::Problem problem;
  std::vector<ArgSpec> specs;
  ir::Function ir;
  Config config;
};

ResolvedProblem resolve(const ProblemOptions& o);

// "2,4,1024,64" (or "2x4x1024x64") -> {2, 4, 1024, 64}; throws tj::Error for anything else.
std::vector<int64_t> parse_shape(const std::string& s);

// Host tensors for the tensor arguments (random N(0,1) inputs, outputs poisoned) and the
// launch arguments that refer to `views` of them.
struct HostArguments {
  std::vector<HostTensor> tensors;          // one per tensor slot, in slot order
  std::vector<int> tensor_slot;             // slot index of each tensor
};
HostArguments make_host_arguments(const ResolvedProblem& r, std::mt19937& rng);

// Arguments for launch/run_reference: views of `tensors` (host or device) in slot order.
std::vector<Arg> launch_arguments(const ResolvedProblem& r, const std::vector<TensorView>& views);

}  // namespace tj::tools

namespace tj::tools {
// Arguments for run_reference: views of the tensors and the runtime scalars (host values
// are baked into the trace).
std::vector<ArgValue> reference_arguments(const ResolvedProblem& r, const std::vector<TensorView>& views);

// Element-wise comparison of a result with the reference.
struct Comparison {
  double max_abs_error = 0;
  double max_abs_reference = 0;
  double relative_rmse = 0;      // ||out - ref|| / ||ref||
  int64_t nan_count = 0;         // NaN where the reference has none (unwritten or wrong)
  bool within(double relative_tolerance) const;
};
Comparison compare(const HostTensor& out, const HostTensor& reference);
double default_tolerance(DType out);    // relative to the largest reference magnitude
}  // namespace tj::tools

namespace tj::tools {
// The architecture to compile for: the requested one, the GPU's, or sm_90a without a GPU.
std::string default_arch(const std::string& requested);

// Throws tj::Error when `bytes` of host memory for `what` ("attention [1, 16, 4096, 128]") would not
// fit in this machine's memory (a clear limit instead of std::bad_alloc).
void check_host_memory(double bytes, const std::string& what);
// The bytes of a problem's tensors (its specs' shapes and dtypes).
double tensor_bytes(const std::vector<ArgSpec>& specs);
}  // namespace tj::tools
