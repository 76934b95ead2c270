// The library's RMSNorm and LayerNorm (kernels/elementwise.cpp) against float64 formulas written
// here: on the CPU reference executor, and on the GPU with the SIMT path's untuned streaming
// config (codegen/simt_config.h) and with small blocks.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "codegen/lowering.h"
#include "gpu.h"
#include "gpu_run.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/jit.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

using tj_test::random_tensor;

// float64 RMSNorm / LayerNorm of x [rows, cols] (layernorm when b is given).
std::vector<double> norm_f64(const HostTensor& x, const HostTensor& w, const HostTensor* b, int64_t rows, int64_t cols,
                             double eps) {
  std::vector<double> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, sq = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x.at(r * cols + c);
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double d = x.at(r * cols + c) - (b ? mean : 0.0);
      sq += d * d;
    }
    const double inv = 1.0 / std::sqrt(sq / cols + eps);
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = (x.at(r * cols + c) - (b ? mean : 0.0)) * inv * w.at(c) + (b ? b->at(c) : 0.0);
  }
  return out;
}

struct NormCase {
  bool layer;
  DType dt;
  int64_t rows, cols;
  double offset;   // added to every x: a row mean large against its spread
};

// The inputs of a case: x, w[, b], out (poisoned).
std::vector<HostTensor> norm_inputs(const NormCase& c, std::mt19937& rng) {
  std::vector<HostTensor> t;
  HostTensor x = random_tensor(c.dt, {c.rows, c.cols}, rng, 2.0);
  if (c.offset != 0) {
    HostTensor shifted(c.dt, {c.rows, c.cols});
    for (int64_t i = 0; i < x.numel(); ++i) shifted.set(i, x.at(i) + c.offset);
    x = std::move(shifted);
  }
  t.push_back(std::move(x));
  t.push_back(random_tensor(c.dt, {c.cols}, rng));
  if (c.layer) t.push_back(random_tensor(c.dt, {c.cols}, rng));
  HostTensor out(c.dt, {c.rows, c.cols});
  out.fill_bytes(0xFF);
  t.push_back(std::move(out));
  return t;
}

// Largest |got - want| relative to max(1, |want|), and the NaN count.
std::pair<double, int64_t> worst_error(const HostTensor& got, const std::vector<double>& want) {
  double worst = 0;
  int64_t nans = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::isnan(got.at(i))) {
      ++nans;
      continue;
    }
    worst = std::max(worst, std::abs(got.at(i) - want[i]) / std::max(1.0, std::abs(want[i])));
  }
  return {worst, nans};
}

// The output's rounding; for rows of mean 1000, the f32 rounding of the mean itself (6e-5 at 1000)
// against a spread of 2 (without the shift, E[x^2] - E[x]^2 would lose every digit there).
double tolerance(const NormCase& c) {
  if (c.offset != 0) return 2e-4;
  return c.dt == DType::f32 ? 2e-5 : c.dt == DType::f16 ? 2e-3 : 1.6e-2;
}

const std::vector<NormCase> kCases = {
    {false, DType::f32, 7, 333, 0}, {false, DType::bf16, 16, 4096, 0}, {false, DType::f16, 3, 40, 0},
    {true, DType::f32, 7, 333, 0},  {true, DType::bf16, 16, 4096, 0},  {true, DType::f32, 5, 1000, 1000.0},
};

}  // namespace

TEST_CASE("norms: rmsnorm and layernorm on the CPU reference executor match float64 (ragged rows, a large mean)") {
  std::mt19937 rng(41);
  for (const NormCase& c : kCases) {
    CAPTURE(fmt::format("{} {} [{}, {}] offset {}", c.layer ? "layernorm" : "rmsnorm", name(c.dt), c.rows, c.cols, c.offset));
    std::vector<HostTensor> t = norm_inputs(c, rng);
    const Kernel& k = c.layer ? kernels::layernorm() : kernels::rmsnorm();
    std::vector<ArgValue> args;
    std::vector<ArgSpec> specs;
    for (const HostTensor& h : t) {
      args.push_back(h.view());
      specs.push_back(TensorSpec{h.dtype(), h.shape()});
    }
    args.push_back(1e-5f);
    specs.push_back(RuntimeScalar{1e-5f});
    const ir::Function f = k.trace(specs);
    run_reference(f, codegen::untuned_config(f, "sm_90a"), args);
    const std::vector<double> want = norm_f64(t[0], t[1], c.layer ? &t[2] : nullptr, c.rows, c.cols, 1e-5);
    // f32 math of the inputs' rounded values: within a few f32 ulps of float64, then the output's rounding.
    const auto [worst, nans] = worst_error(t.back(), want);
    CHECK(nans == 0);
    CHECK(worst <= tolerance(c));
  }
}

TEST_CASE("gpu: rmsnorm and layernorm match float64 with the untuned streaming config, with small blocks and persistent") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(43);
  for (const NormCase& c : kCases) {
    // untuned, blocks of 64, untuned with knob persistent (two blocks looping over the rows too)
    for (int mode : {0, 1, 2, 3}) {
      const bool untuned = mode != 1;
      CAPTURE(fmt::format("{} {} [{}, {}] offset {} {}", c.layer ? "layernorm" : "rmsnorm", name(c.dt), c.rows, c.cols, c.offset,
                          mode == 0 ? "untuned" : mode == 1 ? "blocks of 64" : mode == 2 ? "persistent" : "2 persistent blocks"));
      std::vector<HostTensor> t = norm_inputs(c, rng);
      const Kernel& k = c.layer ? kernels::layernorm() : kernels::rmsnorm();
      std::vector<ArgSpec> specs;
      for (const HostTensor& h : t) specs.push_back(contiguous_spec(h.dtype(), h.shape()));
      specs.push_back(RuntimeScalar{1e-5f});
      const ir::Function f = k.trace(specs);
      Config cfg = untuned ? codegen::untuned_config(f, "sm_90a") : Config::from_json(R"({"blocks":{"c":64,"c2":64},"num_warps":4})");
      if (mode == 3) {
        cfg.knobs["persistent"] = 1;
        cfg.knobs["persistent_blocks"] = 2;
      }
      if (mode == 2) {
        // A persistent SIMT grid: as many blocks an SM as the occupancy calculator fits (not one).
        cfg.knobs["persistent"] = 1;
        const CompiledKernel& ck = compile(k, specs, cfg, CompileRequest{});
        CHECK(ck.generated.blocks_per_sm == 0);
        CHECK(ck.resident_blocks > 1);
        const int sms = runtime::current_device().sm_count;
        CHECK(launch_geometry(ck, c.rows, sms).grid.x == std::min<int64_t>(c.rows, int64_t{sms} * ck.resident_blocks));
      }
      const tj_test::BothRuns r = tj_test::run_reference_and_gpu(k, t, {Arg(1e-5)}, t.size() - 1, cfg);
      CHECK(r.lowering == "simt");
      const std::vector<double> want = norm_f64(t[0], t[1], c.layer ? &t[2] : nullptr, c.rows, c.cols, 1e-5);
      const auto [worst, nans] = worst_error(r.gpu, want);
      CHECK(nans == 0);
      CHECK(worst <= tolerance(c));
      // and the GPU's output equals the reference executor's to the output's rounding
      std::vector<double> reference(r.reference.numel());
      for (int64_t i = 0; i < r.reference.numel(); ++i) reference[i] = r.reference.at(i);
      CHECK(worst_error(r.gpu, reference).first <= tolerance(c));
    }
  }
}
