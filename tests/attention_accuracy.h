#pragma once
// Helpers of the FP8 attention accuracy tests: inputs, float64 attention, error metrics, and a
// float64 emulation of attention_fp8_forward's quantization recipes (kernels/attention_fp8.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "autotune/launch.h"
#include "runtime/jit.h"
#include "core/numerics.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

namespace tj_test {

// Runs `k` on the CPU reference executor with `args` (host tensors, numbers, host flags).
inline void run_ref(const tj::Kernel& k, const std::vector<tj::Arg>& args, const tj::Config& cfg) {
  tj::ir::Function f = k.trace(tj::specs_for(k, args, false));
  std::vector<tj::ArgValue> ref;
  for (size_t i = 0; i < args.size(); ++i) {
    if (k.slots()[i].is_host()) continue;
    if (const auto* t = std::get_if<tj::TensorView>(&args[i])) ref.emplace_back(*t);
    else ref.emplace_back(static_cast<float>(std::get<double>(args[i])));
  }
  tj::run_reference(f, cfg, ref);
}

// Every element v (rounded to dt).
inline tj::HostTensor filled(tj::DType dt, std::vector<int64_t> shape, double v) {
  tj::HostTensor t(dt, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
  return t;
}

// N(0,1) (+ N(0, 10^2) with probability outlier_p: the outlier inputs), rounded to dt.
// A device view with no memory behind it: enough for the argument checks that run before a launch.
inline tj::TensorView unbacked_device_view(tj::DType dt, std::vector<int64_t> shape) {
  tj::TensorView v;
  v.dtype = dt;
  v.shape = std::move(shape);
  v.device = tj::Device::cuda;
  return v;
}

inline tj::HostTensor randn(tj::DType dt, std::vector<int64_t> shape, std::mt19937& rng, double outlier_p = 0.0) {
  tj::HostTensor t(dt, std::move(shape));
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double x = n(rng);
    if (outlier_p > 0 && u(rng) < outlier_p) x += 10.0 * n(rng);
    t.set(i, x);
  }
  return t;
}

// One (b, h) slice as rows: rows[i * cols + j].
struct Rows {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double at(int64_t i, int64_t j) const { return v[i * cols + j]; }
};
inline Rows slice(const std::vector<double>& all, int64_t bh, int64_t rows, int64_t cols) {
  Rows r{rows, cols, std::vector<double>(all.begin() + bh * rows * cols, all.begin() + (bh + 1) * rows * cols)};
  return r;
}

// float64 softmax(q kᵀ · scale) v of one slice (q [Sq, Dqk], k [Skv, Dqk], v [Skv, Dv]). With
// p_quantized, P = e4m3(exp(s - m) · 256) / 256 in the product, with the row sum of the
// unquantized P (as attention_fp8 does when it writes the LSE; without one, fp8 sums the quantized
// P: the same error on random inputs, bench/archive, 2026-11-26). Appends the output rows 0,
// stride, 2·stride, ... to `out`.
inline void attention_slice(const Rows& q, const Rows& k, const Rows& v, double scale, bool p_quantized,
                            std::vector<double>& out, int64_t query_stride = 1) {
  std::vector<double> s(k.rows), acc(v.cols);
  for (int64_t i = 0; i < q.rows; i += query_stride) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < k.rows; ++j) {
      double d = 0;
      for (int64_t t = 0; t < q.cols; ++t) d += q.at(i, t) * k.at(j, t);
      s[j] = d * scale;
      mx = std::max(mx, s[j]);
    }
    double l = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k.rows; ++j) {
      double p = std::exp(s[j] - mx);
      l += p;
      if (p_quantized) p = tj::numerics::round_double_to(tj::DType::e4m3, p * 256.0) / 256.0;
      for (int64_t t = 0; t < v.cols; ++t) acc[t] += p * v.at(j, t);
    }
    for (int64_t t = 0; t < v.cols; ++t) out.push_back(acc[t] / l);
  }
}

// float64 attention (non-causal) of q [B,H,Sq,D], k / v [B,H,Skv,D] as stored, scale 1/sqrt(D);
// query rows 0, stride, ... of each (b, h) (every row by default: the [B,H,Sq,D] output).
inline std::vector<double> attention_f64(const tj::HostTensor& q, const tj::HostTensor& k, const tj::HostTensor& v,
                                         int64_t query_stride = 1) {
  const int64_t BH = q.shape()[0] * q.shape()[1], Sq = q.shape()[2], D = q.shape()[3], Skv = k.shape()[2];
  std::vector<double> qv = q.values(), kv = k.values(), vv = v.values(), out;
  out.reserve(q.numel());
  for (int64_t bh = 0; bh < BH; ++bh)
    attention_slice(slice(qv, bh, Sq, D), slice(kv, bh, Skv, D), slice(vv, bh, Skv, D), 1.0 / std::sqrt(double(D)), false,
                    out, query_stride);
  return out;
}

// float64 attention of logical q [B, H, Sq, D], k / v [B, Hkv, Skv, D] (query head h reads kv head
// h / (H / Hkv)), scale 1/sqrt(D), causal top-left; the [B, H, Sq, D] output.
inline std::vector<double> gqa_attention_f64(const tj::HostTensor& q, const tj::HostTensor& k, const tj::HostTensor& v,
                                             bool causal) {
  const int64_t B = q.shape()[0], H = q.shape()[1], Sq = q.shape()[2], D = q.shape()[3];
  const int64_t Hkv = k.shape()[1], Skv = k.shape()[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const std::vector<double> qv = q.values(), kv = k.values(), vv = v.values();
  std::vector<double> out(q.numel());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t qo = (b * H + h) * Sq * D, ko = (b * Hkv + h / (H / Hkv)) * Skv * D;
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t n = causal ? std::min(i + 1, Skv) : Skv;
        std::vector<double> s(n);
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t t = 0; t < D; ++t) d += qv[qo + i * D + t] * kv[ko + j * D + t];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        std::vector<double> acc(D, 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(s[j] - mx);
          l += p;
          for (int64_t t = 0; t < D; ++t) acc[t] += p * vv[ko + j * D + t];
        }
        for (int64_t t = 0; t < D; ++t) out[qo + i * D + t] = acc[t] / l;
      }
    }
  return out;
}

// x [A, B, C, D] with dims 1 and 2 swapped, as a new contiguous tensor: [B, H, S, D] values to
// [B, S, H, D] storage and back (the swap is its own inverse).
inline tj::HostTensor swap_dims_1_2(const tj::HostTensor& x) {
  const auto& s = x.shape();
  tj::HostTensor y(x.dtype(), {s[0], s[2], s[1], s[3]});
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c)
        for (int64_t d = 0; d < s[3]; ++d) y.set(((a * s[2] + c) * s[1] + b) * s[3] + d, x.at(((a * s[1] + b) * s[2] + c) * s[3] + d));
  return y;
}

// A [B, S, H, D] device buffer seen as [B, H, S, D] (strided, no copy).
inline tj::TensorView bshd_view(const tj::DeviceTensor& t) {
  tj::TensorView v = t.view();
  const auto s = v.shape;
  v.shape = {s[0], s[2], s[1], s[3]};
  v.strides = {s[1] * s[2] * s[3], s[3], s[2] * s[3], 1};
  return v;
}

struct Metrics {
  double rel_rmse = 0, rmse = 0, cosine = 0, max_abs = 0;
  int64_t nan = 0;
};
inline Metrics compare(const std::vector<double>& got, const std::vector<double>& ref) {
  double se = 0, sr = 0, so = 0, sor = 0;
  Metrics m;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) {
      ++m.nan;
      continue;
    }
    double e = got[i] - ref[i];
    se += e * e;
    sr += ref[i] * ref[i];
    so += got[i] * got[i];
    sor += got[i] * ref[i];
    m.max_abs = std::max(m.max_abs, std::fabs(e));
  }
  m.rel_rmse = std::sqrt(se / std::max(sr, 1e-300));
  m.rmse = std::sqrt(se / static_cast<double>(std::max<size_t>(got.size(), 1)));
  m.cosine = sor / std::sqrt(std::max(so * sr, 1e-300));
  return m;
}
inline std::string str(const Metrics& m) {
  return fmt::format("rel RMSE {:.3e}, RMSE {:.3e}, cosine {:.6f}, max abs {:.3e}, NaN {}", m.rel_rmse, m.rmse, m.cosine,
                     m.max_abs, m.nan);
}

// A quantization recipe of attention_fp8_forward (AttentionFp8Options::hadamard, q_residual).
struct Recipe {
  bool hadamard = false, q_residual = false;
  std::string name() const {
    if (hadamard && q_residual) return "hadamard + q_residual";
    if (hadamard) return "hadamard";
    return q_residual ? "q_residual" : "plain";
  }
};
inline const std::vector<Recipe>& all_recipes() {
  static const std::vector<Recipe> r = {{false, false}, {true, false}, {false, true}, {true, true}};
  return r;
}

// Sylvester's Hadamard, ±1/√d, in float64 (d a power of two).
inline std::vector<double> hadamard_f64(int64_t d) {
  std::vector<double> h(d * d);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) h[i * d + j] = (__builtin_popcountll(uint64_t(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(double(d));
  return h;
}

inline Rows rotated(const Rows& x, const std::vector<double>& h) {
  Rows r{x.rows, x.cols, std::vector<double>(x.v.size(), 0.0)};
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t t = 0; t < x.cols; ++t)
      for (int64_t j = 0; j < x.cols; ++j) r.v[i * x.cols + j] += x.at(i, t) * h[t * x.cols + j];
  return r;
}

// x ≈ x8 · descale: per-slice amax scaling to e4m3's 448, round to nearest (x8 in scaled units).
struct Quantized {
  Rows x8;
  double descale = 1;
};
inline Quantized quantize_e4m3(const Rows& x) {
  double amax = 0;
  for (double e : x.v) amax = std::max(amax, std::fabs(e));
  Quantized q{x, amax > 0 ? amax / 448.0 : 1.0};
  for (double& e : q.x8.v) e = tj::numerics::round_double_to(tj::DType::e4m3, e / q.descale);
  return q;
}

// float64 emulation of a recipe on q [B,H,Sq,D], k / v [B,H,Skv,D]: the same quantization as the
// kernels (per-(b, h) e4m3 of Q, K (rotated with hadamard), V; Q + its e4m3 residual with
// q_residual; P quantized), everything else exact. Query rows as attention_f64.
inline std::vector<double> emulate_recipe(const tj::HostTensor& q, const tj::HostTensor& k, const tj::HostTensor& v,
                                          const Recipe& r, int64_t query_stride = 1) {
  const int64_t BH = q.shape()[0] * q.shape()[1], Sq = q.shape()[2], D = q.shape()[3], Skv = k.shape()[2];
  const std::vector<double> qv = q.values(), kv = k.values(), vv = v.values(), h = hadamard_f64(D);
  std::vector<double> out;
  out.reserve(q.numel());
  for (int64_t bh = 0; bh < BH; ++bh) {
    Rows qs = slice(qv, bh, Sq, D), ks = slice(kv, bh, Skv, D);
    if (r.hadamard) {
      qs = rotated(qs, h);
      ks = rotated(ks, h);
    }
    Quantized q8 = quantize_e4m3(qs), k8 = quantize_e4m3(ks), v8 = quantize_e4m3(slice(vv, bh, Skv, D));
    if (r.q_residual)   // Q_hi + e4m3(Q / descale - Q_hi), same scale
      for (size_t i = 0; i < q8.x8.v.size(); ++i)
        q8.x8.v[i] += tj::numerics::round_double_to(tj::DType::e4m3, qs.v[i] / q8.descale - q8.x8.v[i]);
    for (double& e : v8.x8.v) e *= v8.descale;
    attention_slice(q8.x8, k8.x8, v8.x8, q8.descale * k8.descale / std::sqrt(double(D)), true, out, query_stride);
  }
  return out;
}

// The query rows 0, stride, ... of each (b, h) of a [B, H, Sq, D] output.
inline std::vector<double> query_rows(const std::vector<double>& o, int64_t BH, int64_t Sq, int64_t D, int64_t query_stride) {
  std::vector<double> r;
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < Sq; i += query_stride)
      r.insert(r.end(), o.begin() + (bh * Sq + i) * D, o.begin() + (bh * Sq + i + 1) * D);
  return r;
}

}  // namespace tj_test
