// bench_linear: the FP8 linear layer (kernels/fp8_linear.h) timed forward, backward and both, at
// M = N = K (4096 and 8192 by default), dynamic and delayed scaling; JSON lines on stdout (or
// --out), a markdown digest on stderr. bench/gemm/linear_peer.py times seed 001's FP8Linear on
// torch._scaled_mm and bf16 torch in the same way; bench/gemm/run_linear.sh runs both.
//
//   bench_linear [--sizes 4096,8192] [--reps 20] [--warmup 3] [--out FILE.jsonl]
//
// Each sample is one call (forward: 5 launches; backward: 10) between two CUDA events behind a
// spin kernel (host overhead hidden); no L2 flush (x, w and dy are 32-128 MB, and the layer
// reads each several times: its copies stay partly in L2, as in training). rel err: the largest
// relative RMS error of y, dx and dw against float64 at 8 sampled rows (columns for dw).
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../common/timing.h"
#include "kernels/fp8_linear.h"
#include "runtime/device.h"
#include "runtime/owned_tensor.h"

using namespace tj;

namespace {

HostTensor randn(std::vector<int64_t> shape, double sd, std::mt19937& rng) {
  HostTensor t(DType::bf16, shape);
  std::normal_distribution<double> n(0.0, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, n(rng));
  return t;
}

// rel RMS error of `got` against float64 at the sampled rows of out = a · bᵀ-like products; `at`
// gives the exact value of entry (i, j).
template <class Exact>
double sampled_error(const HostTensor& got, int64_t rows, int64_t cols, Exact exact) {
  double se = 0, sr = 0;
  for (int s = 0; s < 8; ++s) {
    const int64_t i = (s * 2654435761LL) % rows;
    for (int64_t j = 0; j < cols; j += 7) {
      const double e = exact(i, j), g = got.at(i * cols + j);
      se += (g - e) * (g - e);
      sr += e * e;
    }
  }
  return std::sqrt(se / std::max(sr, 1e-300));
}

}  // namespace

int run(int argc, char** argv) {
  std::vector<int64_t> sizes = {4096, 8192};
  int reps = 20, warmup = 3;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--sizes") {
      sizes.clear();
      const std::string v = next();
      for (size_t p = 0; p < v.size();) {
        const size_t q = v.find(',', p);
        sizes.push_back(std::stoll(v.substr(p, q - p)));
        p = q == std::string::npos ? v.size() : q + 1;
      }
    } else if (a == "--reps") {
      reps = std::stoi(next());
    } else if (a == "--warmup") {
      warmup = std::stoi(next());
    } else if (a == "--out") {
      out_path = next();
    } else {
      std::fprintf(stderr, "usage: bench_linear [--sizes 4096,8192] [--reps 20] [--warmup 3] [--out FILE.jsonl]\n");
      return 2;
    }
  }
  FILE* out = out_path.empty() ? stdout : std::fopen(out_path.c_str(), "w");
  const runtime::DeviceInfo& dev = runtime::current_device();
  bench::Spinner spinner;
  spinner.init(dev.arch());
  runtime::Stream stream;
  std::mt19937 rng(2026);
  std::fprintf(stderr, "| M = N = K | scaling | forward ms | backward ms | both ms | TFLOP/s (both: 6 M N K) | rel err y / dx / dw |\n");
  std::fprintf(stderr, "| ---: | --- | ---: | ---: | ---: | ---: | --- |\n");
  for (int64_t S : sizes) {
    const int64_t M = S, N = S, K = S;
    const HostTensor hx = randn({M, K}, 1.0, rng), hw = randn({N, K}, 0.02, rng), hdy = randn({M, N}, 1e-3, rng);
    const DeviceTensor x = DeviceTensor::from_host(hx), w = DeviceTensor::from_host(hw), dy = DeviceTensor::from_host(hdy);
    DeviceTensor y(DType::bf16, {M, N}), dx(DType::bf16, {M, K}), dw(DType::f32, {N, K});
    for (kernels::Fp8Scaling scaling : {kernels::Fp8Scaling::dynamic, kernels::Fp8Scaling::delayed}) {
      kernels::Fp8LinearOptions opt;
      opt.scaling = scaling;
      opt.stream = stream.get();
      kernels::Fp8LinearState st;
      auto fwd = [&](int, CUstream) { kernels::fp8_linear_forward(x.view(), w.view(), std::nullopt, y.view(), opt, st); };
      auto bwd = [&](int, CUstream) { kernels::fp8_linear_backward(dy.view(), x.view(), w.view(), dx.view(), dw.view(), opt, st); };
      auto both = [&](int i, CUstream s) {
        fwd(i, s);
        bwd(i, s);
      };
      const double f = bench::median(bench::time_samples(fwd, spinner, stream, warmup, reps, 20.0));
      const double b = bench::median(bench::time_samples(bwd, spinner, stream, warmup, reps, 20.0));
      const double fb = bench::median(bench::time_samples(both, spinner, stream, warmup, reps, 20.0));
      stream.synchronize();
      const HostTensor gy = y.to_host(), gdx = dx.to_host(), gdw = dw.to_host();
      const double ey = sampled_error(gy, M, N, [&](int64_t i, int64_t j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += hx.at(i * K + k) * hw.at(j * K + k);
        return acc;
      });
      const double edx = sampled_error(gdx, M, K, [&](int64_t i, int64_t k) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += hdy.at(i * N + n) * hw.at(n * K + k);
        return acc;
      });
      const double edw = sampled_error(gdw, N, K, [&](int64_t n, int64_t k) {
        double acc = 0;
        for (int64_t m = 0; m < M; ++m) acc += hdy.at(m * N + n) * hx.at(m * K + k);
        return acc;
      });
      const char* sc = scaling == kernels::Fp8Scaling::dynamic ? "dynamic" : "delayed";
      const double tflops = 6.0 * M * N * K / (fb * 1e-3) / 1e12;
      std::fprintf(out,
                   "{\"impl\": \"tilejit fp8_linear\", \"scaling\": \"%s\", \"size\": %lld, \"forward_ms\": %.4f, \"backward_ms\": %.4f, "
                   "\"both_ms\": %.4f, \"tflops\": %.1f, \"err_y\": %.3e, \"err_dx\": %.3e, \"err_dw\": %.3e}\n",
                   sc, (long long)S, f, b, fb, tflops, ey, edx, edw);
      std::fflush(out);
      std::fprintf(stderr, "| %lld | %s | %.4f | %.4f | %.4f | %.1f | %.2e / %.2e / %.2e |\n", (long long)S, sc, f, b, fb, tflops, ey,
                   edx, edw);
    }
  }
  if (out != stdout) std::fclose(out);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_linear: %s\n", e.what());
    return 1;
  }
}
