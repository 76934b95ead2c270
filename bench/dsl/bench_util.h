#pragma once
// Pieces that bench_dsl's case groups share: random inputs rounded to their type, argument lists
// and the relative RMS error of sampled outputs against float64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/jit.h"
#include "runtime/owned_tensor.h"

namespace tj::bench_dsl {

// Fills a tensor with N(0, scale) values rounded to its type, in parallel.
inline HostTensor random_tensor(DType dt, std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  HostTensor t(dt, std::move(shape));
  const int64_t n = t.numel();
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      std::mt19937_64 rng(seed * 1315423911ull + static_cast<uint64_t>(w));
      std::normal_distribution<double> nd(0.0, scale);
      for (int64_t i = w; i < n; i += threads) t.set(i, nd(rng));
    });
  for (auto& th : pool) th.join();
  return t;
}

inline std::vector<Arg> args_of(std::vector<DeviceTensor>& dev, const std::vector<Arg>& tail) {
  std::vector<Arg> a;
  for (auto& d : dev) a.push_back(d.view());
  a.insert(a.end(), tail.begin(), tail.end());
  return a;
}

// Relative RMS error over sampled entries (reference, measured); NaN when any measured one is.
inline double rel_rms(const std::vector<std::pair<double, double>>& pairs) {
  double e = 0, r = 0;
  for (auto [ref, got] : pairs) {
    if (std::isnan(got)) return NAN;
    e += (got - ref) * (got - ref);
    r += ref * ref;
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

}  // namespace tj::bench_dsl
