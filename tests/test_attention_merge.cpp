// kernels/library.h's convert (a strided gather into a contiguous tensor, rounding to the output's
// dtype) and merge_attention (two partial attentions merged by their logsumexps), on the CPU
// reference executor against the same arithmetic in float64.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attention_accuracy.h"
#include "kernels/library.h"
#include "runtime/owned_tensor.h"

using namespace tj;

TEST_CASE("convert gathers a strided view (every other head and row) and rounds each element to the output's dtype") {
  std::mt19937 rng(3);
  const HostTensor x = tj_test::randn(DType::f16, {2, 4, 70, 96}, rng);
  TensorView sparse = every_of(every_of(x.view(), 1, 1, 2), 2, 1, 2);   // heads 1, 3; rows 1, 3, ..., 69
  HostTensor out(DType::bf16, {2, 2, 35, 96});
  out.fill_bytes(0xFF);
  Config cfg;
  cfg.blocks = {{"r", 16}, {"c", 64}};
  tj_test::run_ref(kernels::convert(), {sparse, out.view()}, cfg);
  HostTensor want(DType::bf16, {2, 2, 35, 96});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t r = 0; r < 35; ++r)
        for (int64_t c = 0; c < 96; ++c)
          want.set(((b * 2 + h) * 35 + r) * 96 + c, x.at(((b * 4 + 2 * h + 1) * 70 + 2 * r + 1) * 96 + c));
  CHECK(std::memcmp(out.data(), want.data(), out.size_bytes()) == 0);
}

TEST_CASE("merge_attention: two partial attentions merged by their logsumexps, rows without keys on either side") {
  std::mt19937 rng(8);
  const int64_t B = 1, H = 2, S = 40, D = 64;
  HostTensor o = tj_test::randn(DType::bf16, {B, H, S, D}, rng), o2 = tj_test::randn(DType::bf16, {B, H, S, D}, rng);
  std::uniform_real_distribution<double> u(-3.0, 5.0);
  std::vector<double> l1(B * H * S), l2(B * H * S);
  for (size_t i = 0; i < l1.size(); ++i) {
    l1[i] = u(rng);
    l2[i] = u(rng);
  }
  // Row 0 of each head has no keys in the first part (whatever its o holds), row 1 none in the
  // second, row 2 none in either.
  for (int64_t h = 0; h < H; ++h) {
    l1[h * S] = -INFINITY;
    l2[h * S + 1] = -INFINITY;
    l1[h * S + 2] = l2[h * S + 2] = -INFINITY;
    for (int64_t x = 0; x < D; ++x) o.set((h * S) * D + x, NAN);
    for (int64_t x = 0; x < D; ++x) o2.set((h * S + 1) * D + x, NAN);
  }
  const HostTensor o_before = o;
  HostTensor lse = HostTensor::from_values(l1, DType::f32, {B, H, S}), lse2 = HostTensor::from_values(l2, DType::f32, {B, H, S});
  Config cfg;
  cfg.blocks = {{"s", 16}};
  tj_test::run_ref(kernels::merge_attention(), {o.view(), lse.view(), o2.view(), lse2.view()}, cfg);
  std::vector<double> got, want;
  for (int64_t r = 0; r < B * H * S; ++r) {
    const double top = std::max(l1[r], l2[r]);
    const double w1 = std::isinf(l1[r]) ? 0 : std::exp(l1[r] - top), w2 = std::isinf(l2[r]) ? 0 : std::exp(l2[r] - top);
    const double den = w1 + w2;
    if (den > 0) CHECK(lse.at(r) == doctest::Approx(top + std::log(den)).epsilon(1e-6));
    else CHECK(lse.at(r) == -INFINITY);
    for (int64_t x = 0; x < D; ++x) {
      const double a = w1 > 0 ? o_before.at(r * D + x) : 0, b = w2 > 0 ? o2.at(r * D + x) : 0;
      want.push_back(den > 0 ? (a * w1 + b * w2) / den : 0.0);
      got.push_back(o.at(r * D + x));
    }
  }
  const tj_test::Metrics m = tj_test::compare(got, want);
  MESSAGE("merged vs float64: ", tj_test::str(m));
  CHECK(m.nan == 0);
  CHECK(m.rel_rmse <= 3e-3);   // the merged O rounded to bf16
}
