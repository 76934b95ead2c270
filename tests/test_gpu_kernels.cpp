// Library kernels on the GPU against the CPU reference executor, through the whole JIT path
// (trace -> CUDA -> NVRTC -> driver). Outputs are poisoned before each launch.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "gpu.h"
#include "gpu_run.h"
#include "kernels/attention_fp8.h"
#include "kernels/library.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace tj_codegen_test {   // tests/test_codegen.cpp
const tj::Kernel& k_running_columns();
}  // namespace tj_codegen_test

namespace {

using tj_test::random_tensor;

struct Outcome {
  double max_abs_err = 0;
  double max_ref = 0;
  int64_t nan_count = 0;
};

// Runs `k` on the CPU reference and on the GPU with the same inputs and config, and compares
// the tensor at `out_index`.
Outcome run_both(const Kernel& k, std::vector<HostTensor>& tensors, const std::vector<Arg>& extra_tail, size_t out_index,
                 const std::optional<Config>& config = std::nullopt) {
  const tj_test::BothRuns r = tj_test::run_reference_and_gpu(k, tensors, extra_tail, out_index, config);
  Outcome o;
  for (int64_t i = 0; i < r.gpu.numel(); ++i) {
    double want = r.reference.at(i), got = r.gpu.at(i);
    if (std::isnan(got) || std::isnan(want)) {
      ++o.nan_count;
      continue;
    }
    o.max_abs_err = std::max(o.max_abs_err, std::abs(want - got));
    o.max_ref = std::max(o.max_ref, std::abs(want));
  }
  return o;
}

double tolerance(DType out) {
  switch (out) {
    case DType::f32: return 2e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 0.13;
  }
}

}  // namespace

TEST_CASE("gpu: vector_add matches the reference for lengths that are not a multiple of the block") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(1);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {1, 1000, 4099}) {
      std::vector<HostTensor> t = {random_tensor(dt, {n}, rng), random_tensor(dt, {n}, rng), HostTensor(dt, {n})};
      Outcome o = run_both(kernels::vector_add(), t, {}, 2);
      INFO(fmt::format("{} n={}", name(dt), n));
      CHECK(o.nan_count == 0);
      CHECK(o.max_abs_err <= tolerance(dt) * std::max(1.0, o.max_ref));
    }
  }
}

TEST_CASE("gpu: softmax matches the reference") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (auto shape : std::vector<std::vector<int64_t>>{{5, 300}, {64, 1024}, {3, 7}}) {
      std::vector<HostTensor> t = {random_tensor(dt, shape, rng, 3.0), HostTensor(dt, shape)};
      Outcome o = run_both(kernels::softmax(), t, {}, 1);
      INFO(fmt::format("{} [{}]", name(dt), fmt::join(shape, ", ")));
      CHECK(o.nan_count == 0);
      CHECK(o.max_abs_err <= tolerance(dt));
    }
  }
}

TEST_CASE("gpu: attention matches the reference (f32, f16, bf16, e4m3, causal and not, ragged lengths)") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(3);
  struct Case { DType in, out; int64_t B, H, S, D; bool causal; };
  std::vector<Case> cases = {
      {DType::f32, DType::f32, 1, 2, 100, 64, false}, {DType::f32, DType::f32, 2, 1, 77, 32, true},
      {DType::f16, DType::f16, 1, 2, 128, 64, true},  {DType::bf16, DType::bf16, 2, 2, 130, 64, false},
      {DType::bf16, DType::bf16, 1, 1, 64, 128, true}, {DType::e4m3, DType::bf16, 1, 2, 96, 64, false},
  };
  for (const Case& c : cases) {
    std::vector<int64_t> shape = {c.B, c.H, c.S, c.D};
    std::vector<HostTensor> t = {random_tensor(c.in, shape, rng), random_tensor(c.in, shape, rng),
                                 random_tensor(c.in, shape, rng), HostTensor(c.out, shape)};
    double scale = 1.4426950408889634 / std::sqrt(double(c.D));
    Outcome o = run_both(kernels::attention(), t, {Arg(scale), Arg(c.causal)}, 3);
    INFO(fmt::format("{}->{} [{}] causal={}", name(c.in), name(c.out), fmt::join(shape, ", "), c.causal));
    CHECK(o.nan_count == 0);
    CHECK(o.max_abs_err <= tolerance(c.out) * std::max(1.0, o.max_ref));
  }
}

TEST_CASE("gpu: attention gives the same answer for several block configs") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(4);
  std::vector<int64_t> shape = {1, 2, 200, 64};
  for (auto [bm, bn, warps] : std::vector<std::tuple<int, int, int>>{{16, 32, 2}, {32, 64, 4}, {64, 16, 8}}) {
    std::vector<HostTensor> t = {random_tensor(DType::f32, shape, rng), random_tensor(DType::f32, shape, rng),
                                 random_tensor(DType::f32, shape, rng), HostTensor(DType::f32, shape)};
    Config cfg;
    cfg.blocks = {{"m", bm}, {"n", bn}};
    cfg.num_warps = warps;
    Outcome o = run_both(kernels::attention(), t, {Arg(0.18), Arg(true)}, 3, cfg);
    INFO(cfg.to_json());
    CHECK(o.nan_count == 0);
    CHECK(o.max_abs_err <= 2e-5);
  }
}

TEST_CASE("gpu: launch rejects host tensors with a clear message") {
  TJ_REQUIRE_GPU();
  HostTensor x(DType::f32, {16}), y(DType::f32, {16}), out(DType::f32, {16});
  CHECK_THROWS_WITH_AS(launch(kernels::vector_add(), {x.view(), y.view(), out.view()}),
                       doctest::Contains("is in host memory"), Error);
}

// launch() compiles in each stride equal to 1 (TensorSpec::strides): a launch on a view whose
// last stride is 2 must take a kernel of its own, not the one compiled for contiguous rows.
TEST_CASE("gpu: Vars that hold a tile loop's tiles (per-column sums and max |x|) match the reference at ragged row counts") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(29);
  for (int64_t R : {1000, 64, 7}) {
    for (const char* cfg : {R"({"blocks":{"r":32},"num_warps":8})", R"({"blocks":{"r":64},"num_warps":4,"knobs":{"simt_vec":8}})"}) {
      CAPTURE(R);
      CAPTURE(cfg);
      std::vector<HostTensor> tensors;
      tensors.push_back(random_tensor(DType::bf16, {5, R, 128}, rng, 3.0));
      tensors.emplace_back(DType::f32, std::vector<int64_t>{5, 2, 128});
      Outcome o = run_both(tj_codegen_test::k_running_columns(), tensors, {}, 1, Config::from_json(cfg));
      CHECK(o.nan_count == 0);
      CHECK(o.max_ref > 0);
      CHECK(o.max_abs_err <= 1e-4 * std::max(1.0, o.max_ref));
    }
  }
}

TEST_CASE("gpu: softmax on contiguous rows and on every other column, launched in turn, both match float64") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int64_t rows = 37, cols = 300;
  // Every other column of a [rows, 2·cols] buffer is x; the contiguous x is the same values.
  HostTensor wide = random_tensor(DType::bf16, {rows, 2 * cols}, rng, 3.0), x(DType::bf16, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.set(r * cols + c, wide.at(r * 2 * cols + 2 * c));
  std::vector<double> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, x.at(r * cols + c));
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(x.at(r * cols + c) - mx);
    for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = std::exp(x.at(r * cols + c) - mx) / sum;
  }
  DeviceTensor dx = DeviceTensor::from_host(x), dwide = DeviceTensor::from_host(wide), out(DType::f32, {rows, cols});
  TensorView every_other = dwide.view();
  every_other.shape = {rows, cols};
  every_other.strides = {2 * cols, 2};
  CHECK(spec_key(specs_for(kernels::softmax(), {dx.view(), out.view()}, false)) !=
        spec_key(specs_for(kernels::softmax(), {every_other, out.view()}, false)));
  for (int pass = 0; pass < 2; ++pass)
    for (const TensorView& in : {dx.view(), every_other}) {
      CAPTURE(pass);
      CAPTURE(in.strides.empty() ? "contiguous" : "last stride 2");
      out.fill_bytes(0xFF);
      launch(kernels::softmax(), {in, out.view()});
      runtime::synchronize();
      HostTensor got = out.to_host();
      double worst = 0;
      int64_t nans = 0;
      for (int64_t i = 0; i < rows * cols; ++i) {
        nans += std::isnan(got.at(i));
        worst = std::max(worst, std::abs(got.at(i) - want[i]));
      }
      CHECK(nans == 0);
      CHECK(worst <= 1e-5);
    }
}

// Programmatic dependent launch of SIMT kernels (LaunchOptions::start_early, sm_90): a kernel that
// starts beside the one before it reads its In tensors at once but writes only after that one has
// finished, and it finishes only after it, so a third kernel that starts early behind it still
// writes after the first. The first kernel here reads x for long (four blocks stream 4 MB each);
// the third overwrites x with values 10^4 times larger: any write before the first is done would
// show in its amaxes.
TEST_CASE("gpu: SIMT kernels started early write only after the kernels before them, through a chain of early starts") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(40);
  const int64_t S = 65536, D = 128, C = 4, n = S * D, small = 4096;
  HostTensor x = random_tensor(DType::bf16, {1, 1, S, D}, rng, 0.01);
  HostTensor big_a = random_tensor(DType::bf16, {n}, rng, 100.0), big_b = random_tensor(DType::bf16, {n}, rng, 100.0);
  HostTensor za = random_tensor(DType::f32, {small}, rng), zb = random_tensor(DType::f32, {small}, rng);
  std::vector<double> want(C, 0.0);   // each chunk's max |x|, S / C rows each
  for (int64_t i = 0; i < n; ++i) want[i / (n / C)] = std::max(want[i / (n / C)], std::abs(x.at(i)));

  DeviceTensor da = DeviceTensor::from_host(big_a), db = DeviceTensor::from_host(big_b);
  DeviceTensor dza = DeviceTensor::from_host(za), dzb = DeviceTensor::from_host(zb);
  LaunchOptions first, beside;
  first.config = kernels::chunk_amax_config();
  first.next_starts_early = true;   // the next kernel starts once its four blocks have started
  beside.config = Config::from_json(R"({"blocks":{"n":1024},"num_warps":8})");
  beside.start_early = true;
  // (A process's first launches load their modules, which spaces them out: rounds 1 and 2 are the
  // tight ones. Without the wait they failed in every run on an H200; round 0 passed.)
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    DeviceTensor dx = DeviceTensor::from_host(x), partial(DType::f32, {1, 1, C}), z(DType::f32, {small});
    partial.fill_bytes(0xFF);
    z.fill_bytes(0xFF);
    TensorView x_flat = dx.view();
    x_flat.shape = {n};
    x_flat.strides = {};
    launch(kernels::chunk_amax(), {dx.view(), partial.view()}, first);
    launch(kernels::vector_add(), {dza.view(), dzb.view(), z.view()}, beside);    // in between, unrelated
    launch(kernels::vector_add(), {da.view(), db.view(), x_flat}, beside);        // overwrites what the first reads
    runtime::synchronize();
    const HostTensor got = partial.to_host();
    for (int64_t c = 0; c < C; ++c) CHECK(got.at(c) == want[c]);
    const HostTensor got_z = z.to_host(), got_x = dx.to_host();
    int64_t z_wrong = 0, x_wrong = 0;
    for (int64_t i = 0; i < small; ++i) z_wrong += got_z.at(i) != static_cast<double>(static_cast<float>(za.at(i) + zb.at(i)));
    for (int64_t i = 0; i < n; i += 97) {
      const double sum = big_a.at(i) + big_b.at(i);
      x_wrong += std::abs(got_x.at(i) - sum) > 1.6e-2 * std::max(1.0, std::abs(sum));
    }
    CHECK(z_wrong == 0);
    CHECK(x_wrong == 0);
  }
}
