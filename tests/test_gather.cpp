// Gathers (TensorArg::gather): reads at computed index tiles, out-of-range positions read 0. On
// the CPU reference executor against a direct loop, through the SIMT path (NVRTC here, the GPU
// where there is one), and the errors that point at the user's line.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "codegen/cuda_emitter.h"
#include "codegen/target.h"
#include "dsl/kernel.h"
#include "gpu.h"
#include "nvrtc_testing.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/memory.h"
#include "runtime/nvrtc.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

// out[i, j] = table[rows[i], 2 j - 3]: rows come from a tensor (some out of range), columns from
// arithmetic on the tile index (the first two and the last ones fall outside the table).
const Kernel& gather_kernel() {
  static const Kernel k = kernel("gather_rows", {"table", "rows", "out"}, [](In table, In rows, Out out) {
    auto [R, C] = out.shape<2>();
    for (auto r : tile(R, block("r"))) {
      for (auto c : tile(C, block("c"))) {
        Tile row = rows.load(r).col();                       // i32 [r, 1]
        Tile col = c.index().row() * 2 - 3;                  // i32 [1, c]
        out.store(r, c, table.gather({row, col}) * 2.0f);    // [r, c]
      }
    }
  });
  return k;
}

struct GatherCase {
  HostTensor table, rows, out;
};

GatherCase make_case(int64_t TR, int64_t TC, int64_t R, int64_t C, std::mt19937& rng) {
  GatherCase g{HostTensor(DType::f32, {TR, TC}), HostTensor(DType::i32, {R}), HostTensor(DType::f32, {R, C})};
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> pick(-2, static_cast<int>(TR) + 1);   // a few out of range
  for (int64_t i = 0; i < TR * TC; ++i) g.table.set(i, normal(rng));
  for (int64_t i = 0; i < R; ++i) g.rows.set(i, pick(rng));
  g.out.fill_bytes(0xFF);
  return g;
}

double expected(const GatherCase& g, int64_t i, int64_t j) {
  const int64_t TR = g.table.shape()[0], TC = g.table.shape()[1];
  const int64_t r = static_cast<int64_t>(g.rows.at(i)), c = 2 * j - 3;
  if (r < 0 || r >= TR || c < 0 || c >= TC) return 0.0;
  return 2.0 * g.table.at(r * TC + c);
}

Config gather_config() { return Config::from_json(R"({"blocks":{"r":16,"c":32},"num_warps":4})"); }

std::string error_of(const std::function<void(In, In, Out)>& body) {
  try {
    kernel("bad_gather", {"table", "rows", "out"}, body)
        .trace({TensorSpec{DType::f32, {8, 8}}, TensorSpec{DType::i32, {8}}, TensorSpec{DType::f32, {8, 8}}});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gather: the reference executor reads each position, 0 out of range") {
  std::mt19937 rng(5);
  GatherCase g = make_case(37, 50, 45, 30, rng);
  const ir::Function f = gather_kernel().trace(specs_for(gather_kernel(), {g.table.view(), g.rows.view(), g.out.view()}, false));
  CHECK(ir::print(f).find("gather table[") != std::string::npos);
  run_reference(f, gather_config(), {g.table.view(), g.rows.view(), g.out.view()});
  int zeros = 0;
  for (int64_t i = 0; i < 45; ++i)
    for (int64_t j = 0; j < 30; ++j) {
      const double want = expected(g, i, j);
      zeros += want == 0.0;
      REQUIRE(g.out.at(i * 30 + j) == doctest::Approx(want).epsilon(1e-6));
    }
  CHECK(zeros > 0);   // the out-of-range paths ran
}

TEST_CASE("gather: the SIMT path compiles it (NVRTC, sm_90a and sm_80)") {
  const ir::Function f = gather_kernel().trace(
      {TensorSpec{DType::f32, {-1, -1}}, TensorSpec{DType::i32, {-1}}, TensorSpec{DType::f32, {-1, -1}}});
  for (const char* arch : {"sm_90a", "sm_80"}) {
    const auto g = codegen::generate_cuda(f, gather_config(), codegen::Target::parse(arch));
    CHECK(g.source.find("tj::dev::gather_at<tj::dev::f32>") != std::string::npos);
    const auto r = tj_test::nvrtc(g, arch);
    CHECK(r.ptx.find(g.entry) != std::string::npos);
  }
}

TEST_CASE("gather: bad index tiles are errors at the user's line") {
  CHECK(error_of([](In t, In r, Out o) { t.gather({0}); }).find("'table' has rank 2 but 1 index tiles were given") !=
        std::string::npos);
  CHECK(error_of([](In t, In r, Out o) { t.gather({0, 1.5}); }).find("index 1 of 'table' must be an integer") !=
        std::string::npos);
  const std::string f = error_of([](In t, In r, Out o) {
    for (auto i : tile(8, block("r"))) t.gather({0, r.load(i).to(DType::f32)});
  });
  CHECK(f.find("must be an integer tile or scalar, got a f32 tile") != std::string::npos);
  CHECK(f.find("test_gather.cpp") != std::string::npos);   // the user's line
  const std::string b = error_of([](In t, In r, Out o) {
    for (auto i : tile(8, block("r")))
      for (auto j : tile(8, block("c"))) t.gather({i.index(), j.index()});   // [r] and [c]: no common shape
  });
  CHECK(b.find("do not broadcast together") != std::string::npos);
  CHECK(error_of([](In t, In r, Out o) { o.gather({0, 0}); }).find("'out' is an output") != std::string::npos);
}

TEST_CASE("gpu: gather through the SIMT path matches the reference executor") {
  TJ_REQUIRE_GPU();
  std::mt19937 rng(6);
  GatherCase g = make_case(300, 200, 333, 120, rng);
  const std::vector<Arg> host = {g.table.view(), g.rows.view(), g.out.view()};
  const ir::Function f = gather_kernel().trace(specs_for(gather_kernel(), host, false));
  run_reference(f, gather_config(), {g.table.view(), g.rows.view(), g.out.view()});
  DeviceTensor table = DeviceTensor::from_host(g.table), rows = DeviceTensor::from_host(g.rows),
               out(DType::f32, {333, 120});
  out.fill_bytes(0xFF);
  LaunchOptions lo;
  lo.config = gather_config();
  launch(gather_kernel(), {table.view(), rows.view(), out.view()}, lo);
  runtime::synchronize();
  const auto got = out.to_host().values(), want = g.out.values();
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
  CHECK(bad == 0);
}
