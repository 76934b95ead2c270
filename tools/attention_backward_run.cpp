// `tilejit run attention --dtype bf16|f16 --backward`: the attention forward (with its LSE), then
// the backward (kernels/attention_backward.h) for a random dO, the gradients checked against
// float64 on sampled heads and rows, and the backward timed. Without a GPU the same kernels run on
// the CPU reference executor (small shapes only), every head checked.
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
#include "tools/problem.h"

namespace tj::tools {

namespace {

// float64 work the automatic check may spend (a few seconds on one core, beside the GPU).
constexpr double kCheckFlopBudget = 8e9;
// Above this the CPU reference executor takes more than a few seconds: without a GPU, skip.
constexpr double kCpuExecutorFlopLimit = 2e9;
// The gradients' bar against float64: bf16 outputs of bf16 inputs (P and dS rounded to 16 bits).
constexpr double kMaxRelRmse = 3e-2;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// dq, dk and dv at rows `rows` of heads `heads` (head-major, then row), each row D values.
struct SampledGrads {
  std::vector<double> dq, dk, dv;
};

// float64 gradients of attention (softmax scale 1/sqrt(D), causal top-left or not) for dL/do =
// dout, at the sampled rows of the sampled heads (a query row for dq, a key row for dk / dv). Each
// head costs about 2 S^2 D multiply-adds: its whole score matrix is formed.
SampledGrads attention_grads_f64(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout, bool causal,
                                 const std::vector<int64_t>& heads, const std::vector<int64_t>& rows) {
  const int64_t S = q.shape()[2], D = q.shape()[3];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  SampledGrads g;
  std::vector<double> Q(S * D), K(S * D), V(S * D), dO(S * D), P(S * S), delta(S);
  for (int64_t bh : heads) {
    const int64_t base = bh * S * D;
    for (int64_t i = 0; i < S * D; ++i) {
      Q[i] = q.at(base + i);
      K[i] = k.at(base + i);
      V[i] = v.at(base + i);
      dO[i] = dout.at(base + i);
    }
    for (int64_t i = 0; i < S; ++i) {
      const int64_t keys = causal ? i + 1 : S;
      double mx = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        double d = 0;
        for (int64_t x = 0; x < D; ++x) d += Q[i * D + x] * K[j * D + x];
        P[i * S + j] = d * scale;
        mx = std::max(mx, P[i * S + j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < keys; ++j) sum += (P[i * S + j] = std::exp(P[i * S + j] - mx));
      for (int64_t j = 0; j < S; ++j) P[i * S + j] = j < keys ? P[i * S + j] / sum : 0.0;
      // delta_i = do_i . o_i, o_i = sum_j P_ij v_j
      delta[i] = 0;
      for (int64_t x = 0; x < D; ++x) {
        double o = 0;
        for (int64_t j = 0; j < keys; ++j) o += P[i * S + j] * V[j * D + x];
        delta[i] += dO[i * D + x] * o;
      }
    }
    auto dp = [&](int64_t i, int64_t j) {
      double d = 0;
      for (int64_t x = 0; x < D; ++x) d += dO[i * D + x] * V[j * D + x];
      return d;
    };
    for (int64_t i : rows) {   // dq_i = scale sum_j dS_ij k_j
      std::vector<double> acc(D, 0.0);
      for (int64_t j = 0; j < S; ++j)
        if (P[i * S + j] != 0.0) {
          const double ds = P[i * S + j] * (dp(i, j) - delta[i]);
          for (int64_t x = 0; x < D; ++x) acc[x] += ds * K[j * D + x] * scale;
        }
      g.dq.insert(g.dq.end(), acc.begin(), acc.end());
    }
    for (int64_t j : rows) {   // dv_j = sum_i P_ij do_i, dk_j = scale sum_i dS_ij q_i
      std::vector<double> dk(D, 0.0), dv(D, 0.0);
      for (int64_t i = 0; i < S; ++i)
        if (P[i * S + j] != 0.0) {
          const double ds = P[i * S + j] * (dp(i, j) - delta[i]);
          for (int64_t x = 0; x < D; ++x) {
            dv[x] += P[i * S + j] * dO[i * D + x];
            dk[x] += ds * Q[i * D + x] * scale;
          }
        }
      g.dk.insert(g.dk.end(), dk.begin(), dk.end());
      g.dv.insert(g.dv.end(), dv.begin(), dv.end());
    }
  }
  return g;
}

// The same rows of a gradient [B, H, S, D] (a contiguous host tensor).
std::vector<double> gather(const HostTensor& t, const std::vector<int64_t>& heads, const std::vector<int64_t>& rows) {
  const int64_t S = t.shape()[2], D = t.shape()[3];
  std::vector<double> out;
  for (int64_t bh : heads)
    for (int64_t i : rows)
      for (int64_t x = 0; x < D; ++x) out.push_back(t.at((bh * S + i) * D + x));
  return out;
}

double rel_rmse(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e += (got[i] - want[i]) * (got[i] - want[i]);
    r += want[i] * want[i];
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

// Prints the check's line; returns whether it passed.
bool report(const SampledGrads& want, const HostTensor& dq, const HostTensor& dk, const HostTensor& dv, const std::vector<int64_t>& heads,
            const std::vector<int64_t>& rows, int64_t heads_total) {
  const double eq = rel_rmse(gather(dq, heads, rows), want.dq), ek = rel_rmse(gather(dk, heads, rows), want.dk),
               ev = rel_rmse(gather(dv, heads, rows), want.dv);
  const bool ok = std::max({eq, ek, ev}) <= kMaxRelRmse;
  const int64_t S = dq.shape()[2];
  fmt::print("check vs float64 gradients ({}): rel RMSE dq {:.2e}, dk {:.2e}, dv {:.2e} (<= {:.0e}): {}\n",
             static_cast<int64_t>(heads.size()) == heads_total && static_cast<int64_t>(rows.size()) == S
                 ? fmt::format("every row of every head")
                 : fmt::format("{} rows of {} of {} heads", rows.size(), heads.size(), heads_total),
             eq, ek, ev, kMaxRelRmse, ok ? "PASS" : "FAIL");
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
  return report(attention_grads_f64(q, k, v, dout, p.causal, heads, sampled), dq, dk, dv, heads, sampled, p.B * p.H) ? 0 : 1;
}

}  // namespace

int run_attention_backward(const AttentionProblem& p, CheckMode check, int repeats) {
  const double backward_flops = 2.5 * p.flops();   // five matrix products against the forward's two
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
    reference = std::async(std::launch::async, [&, h = heads, r = rows] { return attention_grads_f64(q, k, v, dout, p.causal, h, r); });

  const CUstream stream = nullptr;   // the legacy stream, as `run attention` (synchronous poisoning)
  const DeviceTensor dq_in = DeviceTensor::from_host(q), dk_in = DeviceTensor::from_host(k), dv_in = DeviceTensor::from_host(v),
                     ddo = DeviceTensor::from_host(dout);
  DeviceTensor o(p.in, p.shape()), lse(DType::f32, {p.B, p.H, p.S}), gq(p.in, p.shape()), gk(p.in, p.shape()), gv(p.in, p.shape());
  for (DeviceTensor* t : {&gq, &gk, &gv}) t->fill_bytes(0xFF);
  kernels::AttentionFp8Options fwd;
  fwd.quantize = false;
  fwd.causal = p.causal;
  fwd.lse = lse.view();
  fwd.stream = stream;
  kernels::AttentionFp8Workspace fws;
  kernels::attention_fp8_forward(dq_in.view(), dk_in.view(), dv_in.view(), o.view(), fwd, fws);
  kernels::AttentionBackwardOptions opt;
  opt.causal = p.causal;
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
  else status = report(reference.get(), gq.to_host(), gk.to_host(), gv.to_host(), heads, rows, p.B * p.H) ? 0 : 1;
  L2Flusher l2;
  const Timing t = time_launches(backward, stream, repeats, 3, l2);
  fmt::print("time: backward {:.4f} ms, {:.1f} TFLOP/s (2.5 forwards' FLOPs; median of {}, L2 flushed before each)\n", t.median_ms,
             backward_flops / (t.median_ms * 1e-3) / 1e12, repeats);
  return status;
}

}  // namespace tj::tools
