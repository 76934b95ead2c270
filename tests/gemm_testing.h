#pragma once
// Shared by the GEMM tests (test_gemm.cpp: sm_90a; test_gemm_sm80.cpp: sm_80 / sm_89): argument
// specs of kernels/gemm.cpp's fp8_gemm and the error measures against a float64 reference.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"

namespace tj_test {

inline bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }
inline tj::TensorSpec T(tj::DType t, std::vector<int64_t> shape) { return tj::TensorSpec{t, std::move(shape)}; }
inline tj::Config cfg(const char* json) { return tj::Config::from_json(json); }

// Arguments of fp8_gemm: a [M,K] e4m3, b [N,K], scale_a [sa], scale_b [sb], bias [nbias], c [M,N].
struct GemmCase {
  int64_t M, N, K;
  int64_t sa = 1, sb = 1, nbias = 0;   // scale lengths (1 or M / N), bias length (0 or N)
  tj::DType out = tj::DType::bf16;
  tj::DType tb = tj::DType::e4m3;
};

inline std::vector<tj::ArgSpec> fp8_specs(const GemmCase& c, bool dynamic = false) {
  auto d = [&](int64_t v) { return dynamic ? -1 : v; };
  using tj::DType;
  return {T(DType::e4m3, {d(c.M), d(c.K)}), T(c.tb, {d(c.N), d(c.K)}), T(DType::f32, {d(c.sa)}),
          T(DType::f32, {d(c.sb)}),         T(DType::f32, {d(c.nbias)}), T(c.out, {d(c.M), d(c.N)})};
}

struct Errors {
  double rel_rms = 0;    // ||out - ref|| / ||ref||
  double max_rel = 0;    // max |out - ref| / (|ref| + rms(ref))
  int64_t nan = 0;
};
inline Errors errors(const std::vector<double>& out, const std::vector<double>& ref) {
  double e2 = 0, r2 = 0;
  Errors e;
  for (double r : ref) r2 += r * r;
  const double rms = std::sqrt(r2 / std::max<size_t>(ref.size(), 1)) + 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) {
      ++e.nan;
      continue;
    }
    const double d = out[i] - ref[i];
    e2 += d * d;
    e.max_rel = std::max(e.max_rel, std::abs(d) / (std::abs(ref[i]) + rms));
  }
  e.rel_rms = std::sqrt(e2 / std::max(r2, 1e-300));
  return e;
}

}  // namespace tj_test
