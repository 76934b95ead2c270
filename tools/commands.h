#pragma once
// Subcommands of the `tilejit` program. Each returns the process exit status.
#include <string>

namespace tj::tools {

// What the user asked to run or show: a library kernel and its problem.
struct ProblemOptions {
  std::string kernel;
  std::string dtype = "f32";
  std::string out_dtype;          // empty: the kernel's default
  std::string shape;              // "2,4,1024,64"; empty: the kernel's default
  bool causal = false;
  std::string config;             // JSON; empty: the default config
  std::string arch;               // empty: the GPU's, or sm_90a without one
};

// `tilejit doctor`: what this machine can do (driver, GPU, NVRTC, features, cache).
int doctor();
// `tilejit show`: the IR, the generated CUDA, or the PTX of a kernel.
int show(const ProblemOptions& p, bool ir, bool ptx);
// `tilejit run`: run on the GPU and check against the CPU reference (CPU reference alone
// without a GPU).
enum class CheckMode { automatic, always, never };   // automatic: when the CPU can afford it
int run(const ProblemOptions& p, CheckMode check, int repeats);
// `tilejit demo`: trace, generate, compile and check kernels end to end, on any machine.
int demo();

}  // namespace tj::tools
