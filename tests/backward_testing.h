#pragma once
// The backward tests' helpers (tests/test_attention_backward.cpp, the ring's in
// tests/test_ring_plan.cpp): float64 attention forward and backward of [B, H, S, D] host tensors,
// and a launch list (kernels/attention_backward.h) run on the CPU reference executor.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/attention_backward.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

namespace tj_test {

using tj::HostTensor;

struct Grads {
  std::vector<double> dq, dk, dv;
};

// sqrt(sum (got - want)^2 / sum want^2) over every element of `got`.
inline double rel_rmse(const HostTensor& got, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    e += (got.at(i) - want[i]) * (got.at(i) - want[i]);
    r += want[i] * want[i];
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

// N(0, 1) samples rounded to `t`.
inline HostTensor random(tj::DType t, std::vector<int64_t> shape, std::mt19937& rng) {
  HostTensor h(t, std::move(shape));
  std::normal_distribution<double> n(0, 1);
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, n(rng));
  return h;
}

// What a variant does to the scores, in float64: the modded score of natural-log score s at
// (query head h, query i, key j), its derivative, and whether key j stays visible to query i.
struct ScoreMeaning {
  std::function<double(double s, int64_t h, int64_t i, int64_t j)> mod = [](double s, int64_t, int64_t, int64_t) { return s; };
  std::function<double(double s, int64_t h, int64_t i, int64_t j)> dmod = [](double, int64_t, int64_t, int64_t) { return 1.0; };
  std::function<bool(int64_t i, int64_t j)> keep = [](int64_t, int64_t) { return true; };
};

// float64 forward (o; lse in natural-log units, -inf for a row that sees no key, whose o is 0) and
// backward of softmax(m.mod(q k^T * scale_nat)) v, masked by m.keep, for q [B, H, Sq, D] and k, v
// [B, Hkv, Skv, D] (query head h reads kv head h / (H / Hkv); dk, dv sum over the heads that share
// theirs).
inline void reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout,
                                const ScoreMeaning& m, double scale_nat, std::vector<double>& o, std::vector<double>& lse, Grads& g) {
  const auto& sh = q.shape();
  const int64_t B = sh[0], H = sh[1], Sq = sh[2], D = sh[3], Hkv = k.shape()[1], S = k.shape()[2], G = H / Hkv;
  o.assign(B * H * Sq * D, 0);
  lse.assign(B * H * Sq, -INFINITY);
  g.dq.assign(B * H * Sq * D, 0);
  g.dk.assign(B * Hkv * S * D, 0);
  g.dv.assign(B * Hkv * S * D, 0);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t h = bh % H, base = bh * Sq * D, kbase = ((bh / H) * Hkv + h / G) * S * D;
    std::vector<double> P(Sq * S, 0.0), raw(Sq * S, 0.0);
    for (int64_t i = 0; i < Sq; ++i) {
      double mx = -INFINITY;
      std::vector<double> s(S, -INFINITY);
      for (int64_t j = 0; j < S; ++j) {
        double d = 0;
        for (int64_t x = 0; x < D; ++x) d += q.at(base + i * D + x) * k.at(kbase + j * D + x);
        raw[i * S + j] = d * scale_nat;
        if (!m.keep(i, j)) continue;
        s[j] = m.mod(d * scale_nat, h, i, j);
        mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;   // no key: o 0, lse -inf, no gradient
      double sum = 0;
      for (int64_t j = 0; j < S; ++j) sum += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx);
      lse[bh * Sq + i] = mx + std::log(sum);
      for (int64_t j = 0; j < S; ++j) P[i * S + j] = std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx) / sum;
      for (int64_t x = 0; x < D; ++x) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += P[i * S + j] * v.at(kbase + j * D + x);
        o[base + i * D + x] = acc;
      }
    }
    for (int64_t i = 0; i < Sq; ++i) {
      double delta = 0;
      for (int64_t x = 0; x < D; ++x) delta += dout.at(base + i * D + x) * o[base + i * D + x];
      for (int64_t j = 0; j < S; ++j) {
        if (P[i * S + j] == 0.0) continue;
        double dp = 0;
        for (int64_t x = 0; x < D; ++x) dp += dout.at(base + i * D + x) * v.at(kbase + j * D + x);
        const double ds = P[i * S + j] * (dp - delta) * m.dmod(raw[i * S + j], h, i, j);
        for (int64_t x = 0; x < D; ++x) {
          g.dv[kbase + j * D + x] += P[i * S + j] * dout.at(base + i * D + x);
          g.dq[base + i * D + x] += ds * k.at(kbase + j * D + x) * scale_nat;
          g.dk[kbase + j * D + x] += ds * q.at(base + i * D + x) * scale_nat;
        }
      }
    }
  }
}

// The same for plain attention, causal (top-left aligned: row i sees keys 0..i) or not, with lse
// in log2 units (what the backward kernels take).
inline void reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout, bool causal,
                                double scale_nat, std::vector<double>& o, std::vector<double>& lse, Grads& g) {
  ScoreMeaning m;
  if (causal) m.keep = [](int64_t i, int64_t j) { return j <= i; };
  reference_attention(q, k, v, dout, m, scale_nat, o, lse, g);
  for (double& x : lse) x /= std::log(2.0);
}

// Runs each launch on the CPU reference executor with its kernel's default config.
inline void run_launches(const std::vector<tj::kernels::BackwardLaunch>& launches) {
  for (const tj::kernels::BackwardLaunch& l : launches) {
    std::vector<tj::ArgSpec> specs;
    std::vector<tj::ArgValue> vals;
    for (const tj::Arg& a : l.args) {
      if (const tj::TensorView* t = std::get_if<tj::TensorView>(&a)) {
        specs.push_back(tj::TensorSpec{t->dtype, t->shape});
        vals.emplace_back(*t);
      } else if (const double* d = std::get_if<double>(&a)) {
        specs.push_back(tj::RuntimeScalar{static_cast<float>(*d)});
        vals.emplace_back(static_cast<float>(*d));
      } else {
        specs.push_back(std::get<bool>(a));
      }
    }
    const tj::ir::Function f = l.kernel->trace(specs);
    tj::run_reference(f, tj::default_config(f), vals);
  }
}

// The dK / dV kernel (attention_bwd_dkdv) and its rewrites on the CPU reference executor, on the
// same random inputs of `shape` [B, H, S, D] (LSEs raised by 6: P below 1): dk then dv of each
// function given, as doubles (poisoned before each run).
inline std::vector<std::vector<double>> dkdv_on_reference(const std::vector<const tj::ir::Function*>& fns, const tj::Config& cfg,
                                                          const std::vector<int64_t>& shape, std::mt19937& rng) {
  const std::vector<int64_t> rows = {shape[0], shape[1], shape[2]};
  auto random = [&](tj::DType t, std::vector<int64_t> s) {
    HostTensor h(t, std::move(s));
    std::normal_distribution<double> n(0, 1);
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, n(rng));
    return h;
  };
  HostTensor q = random(tj::DType::bf16, shape), k = random(tj::DType::bf16, shape), v = random(tj::DType::bf16, shape),
             dout = random(tj::DType::bf16, shape), lse = random(tj::DType::f32, rows), delta = random(tj::DType::f32, rows);
  for (int64_t i = 0; i < lse.numel(); ++i) lse.set(i, lse.at(i) + 6.0);
  std::vector<std::vector<double>> got;
  for (const tj::ir::Function* fn : fns) {
    HostTensor dk(tj::DType::bf16, shape), dv(tj::DType::bf16, shape);
    dk.fill_bytes(0xFF);
    dv.fill_bytes(0xFF);
    tj::run_reference(*fn, cfg, {q.view(), k.view(), v.view(), dout.view(), lse.view(), delta.view(), dk.view(), dv.view(), 0.2f});
    std::vector<double> out;
    for (int64_t i = 0; i < dk.numel(); ++i) out.push_back(dk.at(i));
    for (int64_t i = 0; i < dv.numel(); ++i) out.push_back(dv.at(i));
    got.push_back(std::move(out));
  }
  return got;
}

}  // namespace tj_test
