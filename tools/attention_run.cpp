// `tilejit run attention --dtype e4m3|bf16|f16`: the FP8 attention pipeline (or attention_fp8 on
// 16-bit inputs) on random N(0, 1) inputs, checked against float64 attention of the unquantized
// inputs and timed. Without a GPU the same kernels run on the CPU reference executor (small
// shapes only), so the numerics can be looked at anywhere.
#include <fmt/format.h>

#include <chrono>
#include <future>
#include <optional>

#include "kernels/attention_fp8.h"
#include "kernels/attention_variant.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/reference.h"
#include "tools/attention.h"
#include "tools/problem.h"

namespace tj::tools {

namespace {

// float64 work the automatic check may spend on sampled rows (about a second on one core).
constexpr double kCheckFlopBudget = 2e9;
// Above this the CPU reference executor (an interpreter, ~0.4 GFLOP/s) takes more than a few
// seconds: without a GPU, skip.
constexpr double kCpuExecutorFlopLimit = 2e9;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double softmax_scale_log2(int64_t D) { return 1.4426950408889634 / std::sqrt(static_cast<double>(D)); }

// The pipeline of kernels::attention_fp8_forward, on the CPU reference executor: quantize_fp8
// (q, k), quantize_transpose_fp8 (v), then attention_fp8 -- or attention_fp8 alone, descales 1,
// for 16-bit inputs.
void pipeline_on_cpu(const AttentionProblem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v, HostTensor& o,
                     const Config& cfg) {
  const std::vector<int64_t> bh{p.B, p.H};
  HostTensor lse(DType::f32, {1});
  const double scale = softmax_scale_log2(p.D);
  if (p.path != AttentionPath::fp8_pipeline) {
    HostTensor ones(DType::f32, bh);
    for (int64_t i = 0; i < ones.numel(); ++i) ones.set(i, 1.0);
    run_on_cpu(kernels::attention_fp8(),
               {q.view(), k.view(), v.view(), ones.view(), ones.view(), ones.view(), o.view(), lse.view(), scale, 1.0, p.causal,
                false},
               cfg);
    return;
  }
  const int64_t S_pad = (p.S + 15) / 16 * 16;
  HostTensor q8(DType::e4m3, p.shape()), k8(DType::e4m3, p.shape()), vt8(DType::e4m3, {p.B, p.H, p.D, S_pad});
  HostTensor qd(DType::f32, bh), kd(DType::f32, bh), vd(DType::f32, bh);
  vt8.fill_bytes(0);   // the pad past S must be finite (the kernel reads it)
  Config qcfg;
  qcfg.blocks = {{"s", 64}, {"s2", 64}};
  run_on_cpu(kernels::quantize_fp8(), {q.view(), q8.view(), qd.view()}, qcfg);
  run_on_cpu(kernels::quantize_fp8(), {k.view(), k8.view(), kd.view()}, qcfg);
  run_on_cpu(kernels::quantize_transpose_fp8(), {v.view(), vt8.view(), vd.view()}, qcfg);
  run_on_cpu(kernels::attention_fp8(),
             {q8.view(), k8.view(), vt8.view(), qd.view(), kd.view(), vd.view(), o.view(), lse.view(), scale, 1.0, p.causal,
              false},
             cfg);
}

// Prints the check's line; returns whether it passed.
bool report_check(const AttentionProblem& p, const AttentionAccuracy& a, const RowSample& s, int64_t heads_total) {
  const AttentionTolerance tol = attention_tolerance(p.path);
  const bool ok = a.passes(tol);
  const bool all = s.count() == heads_total * p.S;
  fmt::print("check vs float64 of the unquantized {} inputs ({}): rel RMSE {:.2e} (<= {:.0e}), cosine {:.6f} (>= {}), "
             "max abs error {:.2e} (largest value {:.3g}), NaN/inf {}, unwritten {}: {}\n",
             name(p.source),
             all ? fmt::format("all {} rows", s.count())
                 : fmt::format("{} rows of {} heads; --check: every row", s.rows.size(), s.heads.size()),
             a.rel_rmse, tol.max_rel_rmse, a.cosine, tol.min_cosine, a.max_abs_error, a.max_abs_reference, a.nan, a.unwritten,
             ok ? "PASS" : "FAIL");
  return ok;
}

// Without a GPU, a problem above the CPU executor's budget runs nothing: say so (before any input
// is made) and return kNothingRan; else nullopt.
std::optional<int> nothing_to_run(const AttentionProblem& p) {
  if (runtime::driver().available() || p.flops() <= kCpuExecutorFlopLimit) return std::nullopt;
  fmt::print("no GPU ({}): nothing ran. The CPU reference executor would need {:.2f} GFLOP for this shape (it runs up to "
             "{:.2f}; e.g. --shape 1,2,256,64)\n",
             runtime::driver().unavailable_reason(), p.flops() / 1e9, kCpuExecutorFlopLimit / 1e9);
  return kNothingRan;
}

int run_on_cpu_executor(const AttentionProblem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v, CheckMode check) {
  const std::string why = runtime::driver().unavailable_reason();
  if (p.hadamard || p.q_residual)
    fmt::print("note: --hadamard / --q-residual run on the GPU; the CPU reference executor runs the plain recipe\n");
  if (p.delayed_scaling)
    fmt::print("note: --delayed-scaling runs on the GPU; on the CPU reference executor the plain recipe (on the same inputs the "
               "two quantize alike)\n");
  Config cfg = p.config ? *p.config : kernels::attention_variant_default_config("", p.in, p.D, p.causal, 0, p.S);
  fmt::print("no GPU ({}): the same kernels on the CPU reference executor instead (config {}; no timing)\n", why, cfg.to_json());
  HostTensor o(p.out, p.shape());
  o.fill_bytes(0xFF);   // NaN in every float type: unwritten elements show
  auto t0 = Clock::now();
  pipeline_on_cpu(p, q, k, v, o, cfg);
  fmt::print("CPU reference executor: {:.0f} ms\n", ms_since(t0));
  if (check == CheckMode::never) {
    fmt::print("check: skipped (--no-check)\n");
    return 0;
  }
  RowSample s = sample_rows(p.B * p.H, p.S, p.D, 0, /*all=*/true);
  AttentionAccuracy a = compare_rows(gather_rows(o.view(), s), attention_f64_rows(q.view(), k.view(), v.view(), p.causal, s));
  a.unwritten = count_nonfinite(o.view());
  return report_check(p, a, s, p.B * p.H) ? 0 : 1;
}

}  // namespace

int run_attention(const ProblemOptions& o, CheckMode check, int repeats) {
  AttentionProblem p = resolve_attention(o);
  if (repeats < 1) throw Error(fmt::format("--repeats must be at least 1, got {}", repeats));
  // The random inputs and the output live in host memory first: refuse a shape they cannot fit
  // (the backward: q, k, v, do and the three gradients).
  const double elems = static_cast<double>(p.B) * p.H * p.S * p.D;
  check_host_memory(elems * (p.backward ? 7 * size_bytes(p.in) : 3 * size_bytes(p.source) + size_bytes(p.out)),
                    fmt::format("attention [{}, {}, {}, {}]", p.B, p.H, p.S, p.D));
  fmt::print("attention{} [B, H, S, D] = [{}, {}, {}, {}]  {}{} -> {}{}\npath: {}{}\n", p.backward ? " backward" : "", p.B, p.H, p.S,
             p.D, name(p.in), p.path == AttentionPath::fp8_pipeline ? " (quantized from random bf16)" : "", name(p.out),
             p.causal ? "  causal" : "", describe(p.path),
             p.backward ? ", then attention_backward (kernels/attention_backward.h: delta, dK / dV, dQ)" : "");
  if (p.backward) return run_attention_backward(p, check, repeats);
  if (const std::optional<int> status = nothing_to_run(p)) return *status;
  const HostTensor q = random_normal(p.source, p.shape(), 1), k = random_normal(p.source, p.shape(), 2),
                   v = random_normal(p.source, p.shape(), 3);
  if (!runtime::driver().available()) return run_on_cpu_executor(p, q, k, v, check);

  const auto& dev = runtime::current_device();
  if (p.path == AttentionPath::fp8_pipeline && !dev.supports_fp8())
    throw Error(fmt::format("--dtype e4m3 needs a GPU with FP8 (compute capability 8.9 or newer); {} is {}.{}", dev.name,
                            dev.cc_major, dev.cc_minor));
  if (!dev.supports_wgmma())
    fmt::print("note: {} ({}) has no wgmma: attention_fp8 runs on the generic tensor-core lowering's mma.sync path here "
               "(the hand-tuned Hopper kernel needs sm_90a)\n",
               dev.name, dev.arch());
  std::string cfg_source = "--config";
  Config cfg = p.config ? *p.config : attention_config(p.in, p.out, p.shape(), p.causal, cfg_source);
  fmt::print("attention_fp8 config {} ({})\n", cfg.to_json(), cfg_source);

  // The float64 reference runs on the host while the GPU works.
  RowSample sample = sample_rows(p.B * p.H, p.S, p.D, kCheckFlopBudget, check == CheckMode::always);
  std::future<std::vector<double>> reference;
  if (check != CheckMode::never)
    reference = std::async(std::launch::async, [&] { return attention_f64_rows(q.view(), k.view(), v.view(), p.causal, sample); });

  // The legacy default stream: DeviceTensor's poisoning and the pipeline's workspace zeroing are
  // synchronous memsets there, which a non-blocking stream's kernels would not wait for.
  const CUstream stream = nullptr;
  DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v);
  DeviceTensor out(p.out, p.shape());
  out.fill_bytes(0xFF);
  kernels::AttentionFp8Options opt;
  opt.causal = p.causal;
  opt.quantize = p.path == AttentionPath::fp8_pipeline;
  opt.hadamard = p.hadamard;
  opt.q_residual = p.q_residual;
  opt.delayed_scaling = p.delayed_scaling;
  opt.attention_config = cfg;
  opt.stream = stream;
  kernels::AttentionFp8Workspace ws;
  auto forward = [&] { kernels::attention_fp8_forward(dq.view(), dk.view(), dv.view(), out.view(), opt, ws); };

  auto t0 = Clock::now();
  forward();
  runtime::synchronize();
  fmt::print("{} ({}): first run {:.0f} ms (tracing, NVRTC or the disk cache, loading)\n", dev.name, dev.arch(), ms_since(t0));
  if (p.delayed_scaling) {
    out.fill_bytes(0xFF);
    forward();   // the first call measured the amaxes; this one and the timed ones scale by them
    runtime::synchronize();
  }

  int status = 0;
  if (check == CheckMode::never) {
    fmt::print("check: skipped (--no-check)\n");
  } else {
    HostTensor got = out.to_host();
    AttentionAccuracy a = compare_rows(gather_rows(got.view(), sample), reference.get());
    a.unwritten = count_nonfinite(got.view());
    status = report_check(p, a, sample, p.B * p.H) ? 0 : 1;
  }

  L2Flusher l2;
  Timing whole = time_launches(forward, stream, repeats, 3, l2);
  if (p.path == AttentionPath::fp8_pipeline) {
    // The attention kernel alone, on the e4m3 copies the pipeline just wrote into `ws`.
    DeviceTensor no_lse(DType::f32, {1});
    LaunchOptions lo;
    lo.config = cfg;
    lo.stream = stream;
    std::vector<Arg> args = {ws.q8->view(), ws.k8->view(), ws.vt8->view(), ws.qd->view(),       ws.kd->view(),
                             ws.vd->view(), out.view(),    no_lse.view(), softmax_scale_log2(p.D), 1.0,
                             p.causal,      false};
    Timing alone = time_launches([&] { launch(kernels::attention_fp8(), args, lo); }, stream, repeats, 3, l2);
    fmt::print("time: attention_fp8 {:.4f} ms, {:.1f} TFLOP/s; with the quantize pre-passes {:.4f} ms, {:.1f} TFLOP/s "
               "(median of {}, L2 flushed before each)\n",
               alone.median_ms, tflops(p.flops(), alone.median_ms), whole.median_ms, tflops(p.flops(), whole.median_ms), repeats);
  } else {
    fmt::print("time: {:.4f} ms (median of {}, L2 flushed before each), {:.1f} TFLOP/s\n", whole.median_ms, repeats,
               tflops(p.flops(), whole.median_ms));
  }
  return status;
}

}  // namespace tj::tools
