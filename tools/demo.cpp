// `tilejit demo`: the whole pipeline on a small kernel, on any machine. Without a GPU it
// still traces, generates CUDA, compiles it with NVRTC for Hopper and Ampere, and checks
// the CPU reference executor against float64; with one it also runs the kernel there.
#include <fmt/format.h>

#include <cmath>

#include "runtime/driver.h"
#include "tools/problem.h"

namespace tj::tools {

namespace {

// softmax of each row of x in float64: an independent check of the executor.
std::vector<double> softmax_f64(const HostTensor& x) {
  int64_t rows = x.shape()[0], cols = x.shape()[1];
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, l = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, x.at(r * cols + c));
    for (int64_t c = 0; c < cols; ++c) l += std::exp(x.at(r * cols + c) - m);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = std::exp(x.at(r * cols + c) - m) / l;
  }
  return out;
}

}  // namespace

int demo() {
  ProblemOptions o;
  o.kernel = "softmax";
  o.shape = "64,1000";
  ResolvedProblem r = resolve(o);
  fmt::print("1. traced kernel '{}' for f32[64, 1000]: {} IR values, blocks: {}\n", r.entry->name, r.ir.values.size(),
             r.config.to_json());

  for (const char* arch : {"sm_90a", "sm_80"}) {
    CompileRequest req;
    req.arch = arch;
    req.want_ptx = true;
    req.load = false;
    const CompiledKernel& ck = compile(r.entry->get(), r.specs, r.config, req);
    fmt::print("2. generated {} lines of CUDA; NVRTC compiled them for {} in {:.0f} ms ({} bytes of CUBIN, {} of PTX)\n",
               std::count(ck.generated.source.begin(), ck.generated.source.end(), '\n'), arch, ck.compile_ms,
               ck.cubin.size(), ck.ptx.size());
  }

  std::mt19937 rng(7);
  HostArguments host = make_host_arguments(r, rng);
  std::vector<TensorView> views = {host.tensors[0].view(), host.tensors[1].view()};
  run_reference(r.ir, r.config, reference_arguments(r, views));
  std::vector<double> exact = softmax_f64(host.tensors[0]);
  HostTensor expected = HostTensor::from_values(exact, DType::f32, host.tensors[1].shape());
  Comparison c = compare(host.tensors[1], expected);
  bool ok = c.within(1e-5);
  fmt::print("3. CPU reference executor vs float64 softmax: max abs error {:.2g}, {} NaN: {}\n", c.max_abs_error, c.nan_count,
             ok ? "OK" : "MISMATCH");
  int status = ok ? 0 : 1;

  if (!runtime::driver().available()) {
    fmt::print("4. no GPU here ({}); on a GPU, `tilejit run softmax` runs it there and checks it against the reference\n",
               runtime::driver().unavailable_reason());
    return status;
  }
  fmt::print("4. on the GPU:\n");
  status |= run(o, CheckMode::always, 20);
  ProblemOptions a;
  a.kernel = "attention";
  a.dtype = "bf16";
  a.shape = "1,4,512,64";
  a.causal = true;
  status |= run(a, CheckMode::always, 20);
  return status;
}

}  // namespace tj::tools
