// `tilejit run attention --dtype bf16|f16|e4m3 --backward`: the attention forward (with its LSE),
// then the backward (kernels/attention_backward.h; e4m3: the FP8 forward and backward from bf16
// inputs) for a random dO, the gradients checked against float64 on sampled heads and rows, and
// the backward timed. Without a GPU the 16-bit kernels run on the CPU reference executor (small
// shapes only), every head checked.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <future>

#include "autotune/launch.h"
#include "core/error.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variant.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/jit.h"
#include "runtime/reference.h"
#include "tools/attention.h"
#include "tools/attention_grads.h"
#include "tools/problem.h"

namespace tj::tools {

namespace {

// float64 work the automatic check may spend (a few seconds on one core, beside the GPU).
constexpr double kCheckFlopBudget = 8e9;
// Above this the CPU reference executor takes more than a few seconds: without a GPU, skip.
constexpr double kCpuExecutorFlopLimit = 2e9;
// The gradients' bar against float64: bf16 outputs of bf16 inputs (P and dS rounded to 16 bits);
// FP8: the recipe's own error is 5-8e-2 (docs/numerics.md).
constexpr double kMaxRelRmse = 3e-2, kMaxRelRmseFp8 = 1.2e-1;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Prints the check's line; returns whether it passed.
bool report(const SampledGrads& want, const HostTensor& dq, const HostTensor& dk, const HostTensor& dv, const std::vector<int64_t>& heads,
            const std::vector<int64_t>& rows, int64_t heads_total, bool fp8 = false) {
  const int64_t S = dq.shape()[2], D = dq.shape()[3];
  const GradErrors e = grad_errors(dq, dk, dv, want, S, D, heads, rows);
  const double eq = e.dq, ek = e.dk, ev = e.dv;
  const double bar = fp8 ? kMaxRelRmseFp8 : kMaxRelRmse;
  const bool ok = e.worst() <= bar;
  fmt::print("check vs float64 gradients ({}): rel RMSE dq {:.2e}, dk {:.2e}, dv {:.2e} (<= {:.0e}): {}\n",
             static_cast<int64_t>(heads.size()) == heads_total && static_cast<int64_t>(rows.size()) == S
                 ? fmt::format("every row of every head")
                 : fmt::format("{} rows of {} of {} heads", rows.size(), heads.size(), heads_total),
             eq, ek, ev, bar, ok ? "PASS" : "FAIL");
  return ok;
}

// Heads and rows the check covers: all of them when `all` or when cheap, else the last head (and
// the first where the budget allows) at evenly spaced rows, the first and the last included.
std::pair<std::vector<int64_t>, std::vector<int64_t>> sample(const AttentionProblem& p, bool all) {
  const int64_t BH = p.B * p.H;
  const double per_head = 2.0 * p.S * p.S * p.D;
  std::vector<int64_t> heads, rows;
  const int64_t affordable = all ? BH : std::max<int64_t>(1, static_cast<int64_t>(kCheckFlopBudget / per_head));
  if (affordable >= BH) {
    for (int64_t h = 0; h < BH; ++h) heads.push_back(h);
  } else {
    heads.push_back(BH - 1);
    if (affordable >= 2) heads.insert(heads.begin(), 0);
  }
  const int64_t n = all ? p.S : std::min<int64_t>(p.S, 16);
  for (int64_t i = 0; i < n; ++i) rows.push_back(n == 1 ? 0 : i * (p.S - 1) / (n - 1));
  return {heads, rows};
}

int backward_on_cpu_executor(const AttentionProblem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                             const HostTensor& dout, CheckMode check) {
  const Config cfg = kernels::attention_variant_default_config("", p.in, p.D, p.causal, 0, p.S);
  fmt::print("no GPU ({}): the same kernels on the CPU reference executor instead (no timing)\n",
             runtime::driver().unavailable_reason());
  const std::vector<int64_t> bh = {p.B, p.H}, rows = {p.B, p.H, p.S};
  HostTensor ones(DType::f32, bh), o(p.in, p.shape()), lse(DType::f32, rows), delta(DType::f32, rows), lse2(DType::f32, rows);
  for (int64_t i = 0; i < ones.numel(); ++i) ones.set(i, 1.0);
  HostTensor dq(p.in, p.shape()), dk(p.in, p.shape()), dv(p.in, p.shape());
  for (HostTensor* t : {&o, &lse, &dq, &dk, &dv}) t->fill_bytes(0xFF);   // NaN: unwritten elements show
  const auto t0 = Clock::now();
  run_on_cpu(kernels::attention_fp8(),
             {q.view(), k.view(), v.view(), ones.view(), ones.view(), ones.view(), o.view(), lse.view(),
              1.4426950408889634 / std::sqrt(static_cast<double>(p.D)), 1.0, p.causal, true},
             cfg);
  kernels::AttentionBackwardOptions opt;
  opt.causal = p.causal;
  for (const kernels::BackwardLaunch& l : kernels::attention_backward_launches(q.view(), k.view(), v.view(), o.view(), dout.view(),
                                                                               lse.view(), dq.view(), dk.view(), dv.view(), opt,
                                                                               delta.view(), lse2.view(), std::nullopt))
    run_on_cpu(*l.kernel, l.args);
  fmt::print("CPU reference executor: {:.0f} ms\n", ms_since(t0));
  if (check == CheckMode::never) {
    fmt::print("check: skipped (--no-check)\n");
    return 0;
  }
  const auto [heads, sampled] = sample(p, /*all=*/true);
  return report(attention_grads_f64(q, k, v, dout, p.S, p.D, p.causal, heads, sampled), dq, dk, dv, heads, sampled, p.B * p.H) ? 0 : 1;
}

}  // namespace

int run_attention_backward(const AttentionProblem& p, CheckMode check, int repeats) {
  const double backward_flops = 2.5 * p.flops();   // five matrix products against the forward's two
  const bool fp8 = p.path == AttentionPath::fp8_pipeline;
  if (!runtime::driver().available() && fp8) {
    fmt::print("no GPU ({}): nothing ran. The FP8 backward quantizes on the GPU (its kernels are checked on the CPU reference "
               "executor by the tests); without a GPU, --dtype bf16 --backward runs the 16-bit kernels there\n",
               runtime::driver().unavailable_reason());
    return kNothingRan;
  }
  if (!runtime::driver().available() && backward_flops > kCpuExecutorFlopLimit) {
    fmt::print("no GPU ({}): nothing ran. The CPU reference executor would need {:.2f} GFLOP for this shape (it runs up to "
               "{:.2f}; e.g. --shape 1,2,128,64)\n",
               runtime::driver().unavailable_reason(), backward_flops / 1e9, kCpuExecutorFlopLimit / 1e9);
    return kNothingRan;
  }
  const HostTensor q = random_normal(p.source, p.shape(), 1), k = random_normal(p.source, p.shape(), 2),
                   v = random_normal(p.source, p.shape(), 3), dout = random_normal(p.source, p.shape(), 4);
  if (!runtime::driver().available()) return backward_on_cpu_executor(p, q, k, v, dout, check);

  const auto& dev = runtime::current_device();
  const auto [heads, rows] = sample(p, check == CheckMode::always);
  std::future<SampledGrads> reference;
  if (check != CheckMode::never)
    reference = std::async(std::launch::async, [&, h = heads, r = rows] { return attention_grads_f64(q, k, v, dout, p.S, p.D, p.causal, h, r); });

  const CUstream stream = nullptr;   // the legacy stream, as `run attention` (synchronous poisoning)
  const DeviceTensor dq_in = DeviceTensor::from_host(q), dk_in = DeviceTensor::from_host(k), dv_in = DeviceTensor::from_host(v),
                     ddo = DeviceTensor::from_host(dout);
  // The 16-bit tensors: the inputs' dtype (e4m3: the bf16 the pipeline quantizes).
  DeviceTensor o(p.source, p.shape()), lse(DType::f32, {p.B, p.H, p.S}), gq(p.source, p.shape()), gk(p.source, p.shape()),
      gv(p.source, p.shape());
  for (DeviceTensor* t : {&gq, &gk, &gv}) t->fill_bytes(0xFF);
  kernels::AttentionFp8Options fwd;
  fwd.quantize = fp8;
  fwd.causal = p.causal;
  fwd.lse = lse.view();
  fwd.stream = stream;
  kernels::AttentionFp8Workspace fws;
  kernels::attention_fp8_forward(dq_in.view(), dk_in.view(), dv_in.view(), o.view(), fwd, fws);
  kernels::AttentionBackwardOptions opt;
  opt.causal = p.causal;
  opt.fp8 = fp8;
  opt.stream = stream;
  kernels::AttentionBackwardWorkspace ws;
  auto backward = [&] {
    kernels::attention_backward(dq_in.view(), dk_in.view(), dv_in.view(), o.view(), ddo.view(), lse.view(), gq.view(), gk.view(),
                                gv.view(), opt, ws);
  };
  const auto t0 = Clock::now();
  backward();
  runtime::synchronize();
  fmt::print("{} ({}): first backward {:.0f} ms (tracing, NVRTC or the disk cache, loading)\n", dev.name, dev.arch(), ms_since(t0));
  int status = 0;
  if (check == CheckMode::never) fmt::print("check: skipped (--no-check)\n");
  else status = report(reference.get(), gq.to_host(), gk.to_host(), gv.to_host(), heads, rows, p.B * p.H, fp8) ? 0 : 1;
  L2Flusher l2;
  const Timing t = time_launches(backward, stream, repeats, 3, l2);
  fmt::print("time: {}backward {:.4f} ms, {:.1f} TFLOP/s (2.5 forwards' FLOPs; median of {}, L2 flushed before each)\n",
             fp8 ? "FP8 (quantizers included) " : "", t.median_ms, backward_flops / (t.median_ms * 1e-3) / 1e12, repeats);
  return status;
}

}  // namespace tj::tools
