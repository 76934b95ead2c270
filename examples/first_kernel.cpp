// Your first tilejit kernel: y = relu(a·x + b) row by row, written as a plain loop nest.
//
//   build/examples/first_kernel
//
// It traces the kernel, prints the IR and the CUDA that tilejit generates, checks the CPU
// reference executor against plain C++, and, when a GPU is present, runs the kernel there
// and checks it against the reference.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "dsl/kernel.h"
#include "runtime/driver.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

int main() {
  using namespace tj;

  // 1. The kernel. `grid` and `tile` loops on the outside become the launch grid: one
  //    program per row and per block of columns. The block size of `tile` is a tunable the
  //    Config sets. Loads and stores are masked at the tensor's edges automatically.
  Kernel saxpy_relu = kernel("saxpy_relu", {"x", "b", "y", "a"}, [](In x, In b, Out y, Scalar a) {
    auto [rows, cols] = x.shape<2>();
    for (auto r : grid(rows)) {
      for (auto c : tile(cols, block("cols"))) {
        auto v = x.load(r, c).to(DType::f32) * a + b.load(c).to(DType::f32);
        y.store(r, c, maximum(v, 0.0).to(y.dtype()));
      }
    }
  });

  // 2. Arguments: tensors own their memory on the host (or the GPU); values are rounded
  //    to the element type (bf16 here) exactly as a cast rounds them.
  const int64_t rows = 4, cols = 1000;
  std::mt19937 rng(1);
  std::normal_distribution<double> normal;
  HostTensor x(DType::bf16, {rows, cols}), b(DType::bf16, {cols}), y(DType::bf16, {rows, cols});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, normal(rng));
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, normal(rng));
  const double a = 0.5;

  // 3. Trace for these argument types and shapes, and look at the IR.
  std::vector<Arg> host_args = {x.view(), b.view(), y.view(), a};
  ir::Function f = saxpy_relu.trace(specs_for(saxpy_relu, host_args, false));
  fmt::print("{}\n", ir::print(f));

  // 4. Generate CUDA and compile it with NVRTC for Hopper (no GPU needed for this).
  Config config = default_config(f);
  config.blocks["cols"] = 128;
  const CompiledKernel& ck = compile(saxpy_relu, specs_for(saxpy_relu, host_args, false), config,
                                     CompileRequest{.arch = "sm_90a", .want_ptx = true, .load = false});
  fmt::print("generated CUDA ({} threads per program):\n{}\n", ck.generated.threads, ck.generated.source);

  // 5. The CPU reference executor runs the same IR; check it against plain C++.
  y.fill_bytes(0xFF);   // poison: every element must be written
  run_reference(f, config, {x.view(), b.view(), y.view(), static_cast<float>(a)});
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double want = std::max(x.at(r * cols + c) * a + b.at(c), 0.0);
      worst = std::max(worst, std::abs(y.at(r * cols + c) - want) / std::max(1.0, std::abs(want)));
    }
  fmt::print("CPU reference vs plain C++: worst relative error {:.2g} (bf16 rounding is 3.9e-3)\n", worst);
  if (!(worst < 8e-3)) return 1;

  // 6. On a GPU: the same kernel through the JIT, checked against the reference.
  if (!runtime::driver().available()) {
    fmt::print("no GPU here ({}): done\n", runtime::driver().unavailable_reason());
    return 0;
  }
  DeviceTensor dx = DeviceTensor::from_host(x), db = DeviceTensor::from_host(b), dy(DType::bf16, {rows, cols});
  dy.fill_bytes(0xFF);
  launch(saxpy_relu, {dx.view(), db.view(), dy.view(), a}, LaunchOptions{.config = config});
  HostTensor got = dy.to_host();
  // The GPU may fuse a·x + b into one FMA (one rounding instead of two): allow one bf16 step.
  int64_t mismatches = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    mismatches += !(std::abs(got.at(i) - y.at(i)) <= 8e-3 * std::max(1.0, std::abs(y.at(i))));
  fmt::print("GPU vs CPU reference: {} of {} elements differ by more than one bf16 step\n", mismatches, got.numel());
  return mismatches == 0 ? 0 : 1;
}
