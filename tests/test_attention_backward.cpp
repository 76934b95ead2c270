// The attention backward written as user code (examples/kernels): its three kernels on the CPU
// reference executor against float64 gradients, and compiled by the generic tensor-core lowering
// for sm_90a (every dot on wgmma, without spills).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <regex>

#include "codegen/cuda_emitter.h"
#include "codegen/lowering.h"
#include "examples/kernels/user_kernels.h"
#include "nvrtc_testing.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

struct Grads {
  std::vector<double> dq, dk, dv;
};

// float64 forward (o, lse in log2 units) and backward of softmax(q k^T * scale_nat) v.
void reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout, bool causal,
                         double scale_nat, std::vector<double>& o, std::vector<double>& lse, Grads& g) {
  const auto& sh = q.shape();
  const int64_t BH = sh[0] * sh[1], S = sh[2], D = sh[3];
  o.assign(BH * S * D, 0);
  lse.assign(BH * S, 0);
  g.dq.assign(BH * S * D, 0);
  g.dk.assign(BH * S * D, 0);
  g.dv.assign(BH * S * D, 0);
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t base = bh * S * D;
    std::vector<double> P(S * S, 0.0);
    for (int64_t i = 0; i < S; ++i) {
      double mx = -INFINITY;
      std::vector<double> s(S, -INFINITY);
      for (int64_t j = 0; j < (causal ? i + 1 : S); ++j) {
        double d = 0;
        for (int64_t x = 0; x < D; ++x) d += q.at(base + i * D + x) * k.at(base + j * D + x);
        s[j] = d * scale_nat;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < S; ++j) sum += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx);
      lse[bh * S + i] = (mx + std::log(sum)) / std::log(2.0);
      for (int64_t j = 0; j < S; ++j) P[i * S + j] = std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx) / sum;
      for (int64_t x = 0; x < D; ++x) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += P[i * S + j] * v.at(base + j * D + x);
        o[base + i * D + x] = acc;
      }
    }
    for (int64_t i = 0; i < S; ++i) {
      double delta = 0;
      for (int64_t x = 0; x < D; ++x) delta += dout.at(base + i * D + x) * o[base + i * D + x];
      for (int64_t j = 0; j < S; ++j) {
        double dp = 0;
        for (int64_t x = 0; x < D; ++x) dp += dout.at(base + i * D + x) * v.at(base + j * D + x);
        const double ds = P[i * S + j] * (dp - delta);
        for (int64_t x = 0; x < D; ++x) {
          g.dv[base + j * D + x] += P[i * S + j] * dout.at(base + i * D + x);
          g.dq[base + i * D + x] += ds * k.at(base + j * D + x) * scale_nat;
          g.dk[base + j * D + x] += ds * q.at(base + i * D + x) * scale_nat;
        }
      }
    }
  }
}

double rel_rmse(const HostTensor& got, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    e += (got.at(i) - want[i]) * (got.at(i) - want[i]);
    r += want[i] * want[i];
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

HostTensor random(DType t, std::vector<int64_t> shape, std::mt19937& rng) {
  HostTensor h(t, std::move(shape));
  std::normal_distribution<double> n(0, 1);
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, n(rng));
  return h;
}

std::vector<ArgValue> values(std::vector<HostTensor*> tensors, std::vector<float> scalars) {
  std::vector<ArgValue> out;
  for (HostTensor* t : tensors) out.emplace_back(t->view());
  for (float s : scalars) out.emplace_back(s);
  return out;
}

}  // namespace

TEST_CASE("attention backward as user code: the CPU reference executor's gradients match float64 (causal and not)") {
  std::mt19937 rng(5);
  const std::vector<int64_t> shape = {1, 2, 96, 32};
  const double scale_nat = 1.0 / std::sqrt(32.0), scale = scale_nat / std::log(2.0);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    HostTensor q = random(DType::bf16, shape, rng), k = random(DType::bf16, shape, rng), v = random(DType::bf16, shape, rng),
               dout = random(DType::bf16, shape, rng);
    std::vector<double> o64, lse64;
    Grads want;
    reference_attention(q, k, v, dout, causal, scale_nat, o64, lse64, want);
    HostTensor o = HostTensor::from_values(o64, DType::bf16, shape);
    HostTensor lse = HostTensor::from_values(lse64, DType::f32, {shape[0], shape[1], shape[2]});
    HostTensor delta(DType::f32, {shape[0], shape[1], shape[2]}), dq(DType::bf16, shape), dk(DType::bf16, shape),
        dv(DType::bf16, shape);
    auto trace = [&](const Kernel& kk, std::vector<ArgSpec> specs) { return kk.trace(specs); };
    const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
    const ir::Function fd = trace(examples::attention_bwd_delta(), {t16, t16, t32});
    run_reference(fd, default_config(fd), values({&o, &dout, &delta}, {}));
    const ir::Function fkv =
        trace(examples::attention_bwd_dkdv(), {t16, t16, t16, t16, t32, t32, t16, t16, RuntimeScalar{0.0f}, causal});
    run_reference(fkv, default_config(fkv), values({&q, &k, &v, &dout, &lse, &delta, &dk, &dv}, {static_cast<float>(scale)}));
    const ir::Function fq = trace(examples::attention_bwd_dq(), {t16, t16, t16, t16, t32, t32, t16, RuntimeScalar{0.0f}, causal});
    run_reference(fq, default_config(fq), values({&q, &k, &v, &dout, &lse, &delta, &dq}, {static_cast<float>(scale)}));
    CHECK(rel_rmse(dv, want.dv) < 2e-2);
    CHECK(rel_rmse(dk, want.dk) < 3e-2);
    CHECK(rel_rmse(dq, want.dq) < 3e-2);
    // The same gradients in one pass: dK / dV per key tile, dQ added into dq_acc by atomic adds
    // (from zero), then converted.
    HostTensor dk1(DType::bf16, shape), dv1(DType::bf16, shape), dq1(DType::bf16, shape);
    HostTensor dq_acc = HostTensor::from_values(std::vector<double>(q.numel(), 0.0), DType::f32, shape);
    const TensorSpec t32s{DType::f32, shape};
    const ir::Function ff =
        trace(examples::attention_bwd_fused(), {t16, t16, t16, t16, t32, t32, t16, t16, t32s, RuntimeScalar{0.0f}, causal});
    run_reference(ff, default_config(ff), values({&q, &k, &v, &dout, &lse, &delta, &dk1, &dv1, &dq_acc}, {static_cast<float>(scale)}));
    const ir::Function fc = trace(examples::attention_bwd_dq_convert(), {t32s, t16});
    run_reference(fc, default_config(fc), values({&dq_acc, &dq1}, {}));
    CHECK(rel_rmse(dv1, want.dv) < 2e-2);
    CHECK(rel_rmse(dk1, want.dk) < 3e-2);
    CHECK(rel_rmse(dq1, want.dq) < 3e-2);
  }
}

TEST_CASE("attention backward as user code: every dot on wgmma for sm_90a and on mma.sync for sm_80, without spills or serialized wgmmas") {
  const std::vector<int64_t> shape = {2, 4, 1024, 128};
  const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
  for (const char* arch : {"sm_90a", "sm_80"})
  for (bool causal : {false, true}) {
    for (const Kernel* k : {&examples::attention_bwd_dkdv(), &examples::attention_bwd_dq(), &examples::attention_bwd_fused()}) {
      const bool dkdv = k != &examples::attention_bwd_dq(), fused = k == &examples::attention_bwd_fused();
      std::vector<ArgSpec> specs = {t16, t16, t16, t16, t32, t32, t16};
      if (dkdv) specs.push_back(t16);
      if (fused) specs.push_back(TensorSpec{DType::f32, shape});
      specs.push_back(RuntimeScalar{0.1f});
      specs.push_back(causal);
      const ir::Function f = k->trace(specs);
      const bool wg = std::string(arch) == "sm_90a";
      const Config c = codegen::untuned_config(f, arch);
      CAPTURE(std::string(arch));
      CAPTURE(f.name);
      CAPTURE(causal);
      CAPTURE(c.to_json());
      const auto g = codegen::generate_cuda(f, c, codegen::Target::parse(arch));
      INFO(g.source);
      CHECK(g.lowering == (wg ? "tensor cores (wgmma)" : "tensor cores (mma.sync)"));
      CHECK(g.notes.empty());
      const auto r = tj_test::nvrtc(g, arch, true, true);
      CHECK(std::regex_search(r.ptx, std::regex(wg ? R"(wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16)"
                                                   : R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32)")));
      INFO(r.log);
      // The fused kernel holds dK, dV and dQ^T's accumulators at once: a few words spill.
      CHECK(tj_test::ptxas_info(r.log).spill_stores <= (fused ? 32 : 0));
      CHECK(r.log.find("serialized") == std::string::npos);   // ptxas kept the wgmmas asynchronous (no C751x)
    }
  }
}
