// `tilejit run`: a library kernel on the GPU, checked against the CPU reference executor.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "runtime/device.h"
#include "runtime/driver.h"
#include "tools/attention.h"
#include "tools/problem.h"

namespace tj::tools {

namespace {

// Work above which the CPU reference is skipped unless --check forces it.
constexpr double kReferenceFlopLimit = 4e9;

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<TensorView> views(const std::vector<HostTensor>& t) {
  std::vector<TensorView> out;
  for (const auto& x : t) out.push_back(x.view());
  return out;
}

int out_tensor(const ResolvedProblem& r, const HostArguments& a) {
  for (size_t i = 0; i < a.tensor_slot.size(); ++i)
    if (r.entry->get().slots()[a.tensor_slot[i]].kind == SlotKind::tensor_out) return static_cast<int>(i);
  throw Error("kernel has no output tensor");
}

}  // namespace

int run(const ProblemOptions& given, CheckMode check, int repeats) {
  // attention with e4m3 / bf16 / f16: the FP8 pipeline or the 16-bit tensor-core path.
  if (runs_attention_pipeline(given)) return run_attention(given, check, repeats);
  if (given.backward)
    throw Error(fmt::format("--backward applies to `tilejit run attention --dtype bf16|f16|e4m3` only (kernels/attention_backward.h), "
                            "not to {} --dtype {}",
                            given.kernel, given.dtype));
  ProblemOptions o = given;
  if (o.batch || o.heads || o.seq || o.head_dim) {
    if (o.kernel != "attention")
      throw Error(fmt::format("--batch/--heads/--seq/--head-dim apply to `tilejit run attention` only; give {} a --shape", o.kernel));
    o.shape = fmt::format("{}", fmt::join(attention_shape(o), ","));   // f32: the SIMT library kernel
    o.batch = o.heads = o.seq = o.head_dim = 0;
  }
  ResolvedProblem r = resolve(o);
  const double bytes = tensor_bytes(r.specs);
  check_host_memory(2 * bytes, fmt::format("{} [{}]", r.entry->name, fmt::join(r.problem.shape, ", ")));   // + the reference's copy
  const double flops = r.entry->flops(r.problem);
  const bool have_gpu = runtime::driver().available();
  const bool run_reference_too =
      check == CheckMode::always || (check == CheckMode::automatic && flops <= kReferenceFlopLimit);
  fmt::print("kernel {}  shape [{}]  {}{}  config {}\n", r.entry->name, fmt::join(r.problem.shape, ", "), name(r.problem.dtype),
             r.problem.causal ? "  causal" : "", r.config.to_json());
  if (!have_gpu && !run_reference_too) {   // said before any input is made
    if (check == CheckMode::never) fmt::print("CPU reference: skipped (--no-check)\n");
    else fmt::print("CPU reference: skipped ({:.1f} GFLOP is too much for the interpreter; --check forces it)\n", flops / 1e9);
    fmt::print("no GPU ({}): nothing ran\n", runtime::driver().unavailable_reason());
    return kNothingRan;
  }
  // Long preparations say what they are doing (random inputs for a billion elements take a while).
  if (bytes > 256e6) {
    fmt::print("preparing {:.1f} GB of random inputs ...\n", bytes / 1e9);
    std::fflush(stdout);
  }
  std::mt19937 rng(20261121);
  HostArguments host = make_host_arguments(r, rng);
  const int out = out_tensor(r, host);

  HostTensor reference = host.tensors[out];
  if (run_reference_too) {
    if (flops > 1e9 || bytes > 256e6) {
      fmt::print("CPU reference executor: {:.1f} GFLOP on {:.1f} GB ...\n", flops / 1e9, bytes / 1e9);
      std::fflush(stdout);
    }
    std::vector<HostTensor> ref_inputs = host.tensors;
    auto t0 = std::chrono::steady_clock::now();
    run_reference(r.ir, r.config, reference_arguments(r, views(ref_inputs)));
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    reference = ref_inputs[out];
    fmt::print("CPU reference executor: {:.1f} ms\n", ms);
  } else {
    if (check == CheckMode::never) fmt::print("CPU reference: skipped (--no-check)\n");
    else fmt::print("CPU reference: skipped ({:.1f} GFLOP is too much for the interpreter; --check forces it)\n", flops / 1e9);
  }

  if (!have_gpu) {
    fmt::print("no GPU ({}): ran the CPU reference executor only\n", runtime::driver().unavailable_reason());
    Comparison self = compare(reference, reference);
    fmt::print("output: {} elements, largest magnitude {:.4g}, {}\n", reference.numel(), self.max_abs_reference,
               self.nan_count == 0 ? "no NaN" : "NaN present");
    return 0;
  }

  const auto& dev = runtime::current_device();
  std::vector<DeviceTensor> dev_tensors;
  for (const auto& t : host.tensors) dev_tensors.push_back(DeviceTensor::from_host(t));
  std::vector<TensorView> dev_views;
  for (const auto& t : dev_tensors) dev_views.push_back(t.view());
  std::vector<Arg> args = launch_arguments(r, dev_views);
  LaunchOptions opts;
  opts.config = r.config;

  auto t0 = std::chrono::steady_clock::now();
  const CompiledKernel& ck = compile(r.entry->get(), r.specs, r.config, CompileRequest{});
  double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{} ({}): compiled for {} in {:.0f} ms{}\n", dev.name, dev.arch(), ck.arch, first_ms,
             ck.from_disk_cache ? " (CUBIN from the disk cache)" : "");
  launch(r.entry->get(), args, opts);
  runtime::synchronize();
  HostTensor got = dev_tensors[out].to_host();

  int status = 0;
  if (run_reference_too) {
    Comparison c = compare(got, reference);
    double tol = default_tolerance(got.dtype());
    bool ok = c.within(tol);
    fmt::print("GPU vs CPU reference: max abs error {:.3g} (largest value {:.3g}), relative RMSE {:.3g}, {} NaN: {}\n",
               c.max_abs_error, c.max_abs_reference, c.relative_rmse, c.nan_count, ok ? "OK" : "MISMATCH");
    status = ok ? 0 : 1;
  }

  runtime::Stream stream;
  opts.stream = stream;
  for (int i = 0; i < 3; ++i) launch(r.entry->get(), args, opts);
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    runtime::Event start, stop;
    start.record(stream);
    launch(r.entry->get(), args, opts);
    stop.record(stream);
    stop.synchronize();
    times.push_back(runtime::Event::elapsed_ms(start, stop));
  }
  double ms = median(times);
  // GB/s counts every tensor argument's bytes once: what a kernel that reads its inputs and
  // writes its outputs once moves (the measure of memory-bound kernels).
  fmt::print("time: {:.4f} ms (median of {}), {:.2f} TFLOP/s, {:.0f} GB/s\n", ms, repeats, flops / (ms * 1e-3) / 1e12,
             bytes / (ms * 1e-3) / 1e9);
  return status;
}

}  // namespace tj::tools
