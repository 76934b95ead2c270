// f32 division of tiles in generated code (tj::dev::divide in codegen/device/tile.cuh): IEEE
// division bit for bit, by CUDA's fast sequence on tiles of moderate values and element by element
// on the others (zeros, tiny, huge, subnormal, infinite and NaN operands).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "autotune/launch.h"
#include "codegen/cuda_emitter.h"
#include "codegen/target.h"
#include "dsl/config.h"
#include "dsl/kernel.h"
#include "gpu.h"
#include "runtime/memory.h"
#include "runtime/owned_tensor.h"

using namespace tj;

namespace {

// o = x / d.col(): every row divided by its own divisor (a softmax's or attention's row sums).
const Kernel& row_divide() {
  static const Kernel k = kernel("row_divide", {"x", "d", "o"}, [](In x, In d, Out o) {
    auto [M, N] = x.shape<2>();
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) o.store(m, n, x.load(m, n) / d.load(m).col());
  });
  return k;
}

Config divide_config() { return Config::from_json(R"({"blocks":{"m":32,"n":64},"num_warps":4})"); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

TEST_CASE("codegen: f32 tile division is tj::dev::divide (no branch per element)") {
  const std::vector<ArgSpec> specs = {contiguous_spec(DType::f32, {100, 192}), contiguous_spec(DType::f32, {100}),
                                      contiguous_spec(DType::f32, {100, 192})};
  for (const char* arch : {"sm_90a", "sm_80"}) {
    CAPTURE(arch);
    const codegen::GeneratedKernel g =
        codegen::generate_cuda(row_divide().trace(specs), divide_config(), codegen::Target::parse(arch));
    CHECK(g.source.find("tj::dev::divide(") != std::string::npos);
  }
}

TEST_CASE("gpu: f32 tile division is IEEE division bit for bit (fast tiles and tiles of zeros, tiny, huge, subnormal, inf, NaN)") {
  TJ_REQUIRE_GPU();
  // Rows 0-63 (two 32-row tiles): moderate values, the fast sequence. Rows 64-99: one kind of
  // special operand per row among moderate ones, so that those tiles divide element by element.
  const int64_t M = 100, N = 192;
  std::mt19937 rng(41);
  std::uniform_real_distribution<double> mant(1.0, 2.0), expo(-20.0, 20.0);
  std::bernoulli_distribution sign(0.5);
  auto moderate = [&] { return (sign(rng) ? -1.0 : 1.0) * mant(rng) * std::exp2(std::floor(expo(rng))); };
  const double specials[] = {0.0, -0.0, 0x1p-70, 0x1p70, 1e-40, -3e-39, INFINITY, -INFINITY, NAN, 0x1p-59, 0x1p61};
  HostTensor x(DType::f32, {M, N}), d(DType::f32, {M}), want(DType::f32, {M, N});
  for (int64_t i = 0; i < M; ++i) {
    const bool special_row = i >= 64;
    const double s = specials[i % std::size(specials)];
    d.set(i, special_row && i % 3 == 0 ? s : moderate());
    for (int64_t j = 0; j < N; ++j) x.set(i * N + j, special_row && i % 3 != 0 && j % 7 == 0 ? s : moderate());
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      want.set(i * N + j, static_cast<float>(x.at(i * N + j)) / static_cast<float>(d.at(i)));   // IEEE, round to nearest
  DeviceTensor dx = DeviceTensor::from_host(x), dd = DeviceTensor::from_host(d), out(DType::f32, {M, N});
  out.fill_bytes(0xFF);
  LaunchOptions lo;
  lo.config = divide_config();
  launch(row_divide(), {dx.view(), dd.view(), out.view()}, lo);
  runtime::synchronize();
  const HostTensor got = out.to_host();
  int64_t bad = 0, fast_rows_bad = 0;
  for (int64_t e = 0; e < M * N; ++e) {
    const float g = static_cast<float>(got.at(e)), w = static_cast<float>(want.at(e));
    const bool same = (std::isnan(g) && std::isnan(w)) || bits(g) == bits(w);
    if (!same && bad++ < 5) MESSAGE("element " << e << ": got " << g << ", IEEE division gives " << w);
    fast_rows_bad += !same && e < 64 * N;
  }
  CHECK(bad == 0);
  CHECK(fast_rows_bad == 0);
}
