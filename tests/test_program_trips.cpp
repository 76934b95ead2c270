// codegen/program_trips: how many programs a launch runs and how their loops' trip counts change
// along the launch loops (persistent blocks for short programs; longest_first's walk direction).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "codegen/cuda_emitter.h"
#include "codegen/program_trips.h"
#include "dsl/kernel.h"
#include "examples/kernels/user_kernels.h"
#include "kernels/attention_backward.h"

using namespace tj;

namespace {

std::vector<const ir::Op*> launch_loops(const ir::Function& f) {
  std::vector<const ir::Op*> out;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind == ir::OpKind::loop && op.launch) out.push_back(&op);
  });
  REQUIRE(out.size() == 2);   // heads, then the tiles
  return out;
}

// [B, H, S, D] bf16 (S < 0: known at launch only).
TensorSpec T(int64_t S, int64_t D = 64) {
  return S < 0 ? TensorSpec{DType::bf16, {2, 4, -1, D}} : contiguous_spec(DType::bf16, {2, 4, S, D});
}
TensorSpec R(int64_t S) { return S < 0 ? TensorSpec{DType::f32, {2, 4, -1}} : contiguous_spec(DType::f32, {2, 4, S}); }

ir::Function forward(int64_t S, bool causal) {
  return examples::readme_attention().trace({T(S), T(S), T(S), T(S), RuntimeScalar{0.125f}, causal});
}
ir::Function dkdv(int64_t S, bool causal) {
  return kernels::attention_bwd_dkdv().trace({T(S), T(S), T(S), T(S), R(S), R(S), T(S), T(S), RuntimeScalar{0.1f}, causal});
}

Config cfg(const char* json) { return Config::from_json(json); }

}  // namespace

TEST_CASE("program trips: the longest program, and which way programs grow along each launch loop") {
  const Config c = cfg(R"({"blocks":{"m":64,"n":32},"num_warps":4})");
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    // Forward: the key loop (32 a tile) ends at the query tile's end when causal: the last query
    // tile's program is the longest, 512 / 32 keys tiles; every program that long otherwise.
    const ir::Function fw = forward(512, causal);
    CHECK(codegen::longest_program_trips(fw, c) == 16);
    CHECK(codegen::static_programs(fw, c) == 2 * 4 * 512 / 64);
    auto lf = launch_loops(fw);
    CHECK(codegen::trip_trend(fw, c, *lf[0]) == 0);
    CHECK(codegen::trip_trend(fw, c, *lf[1]) == (causal ? 1 : 0));
    // Backward dK / dV: per key tile (32 keys) the query loop (64 a tile) starts at the key tile
    // when causal: the first key tile's program is the longest, the later ones shorter.
    const ir::Function kv = dkdv(512, causal);
    CHECK(codegen::longest_program_trips(kv, c) == 8);
    auto lk = launch_loops(kv);
    CHECK(codegen::trip_trend(kv, c, *lk[0]) == 0);
    CHECK(codegen::trip_trend(kv, c, *lk[1]) == (causal ? -1 : 0));
  }
  // Sizes known at launch only: no trip counts; the direction from the bounds' shape (a loop's end
  // that depends on the index grows with it, a begin alone shrinks).
  const ir::Function fw = forward(-1, true), kv = dkdv(-1, true);
  CHECK_FALSE(codegen::longest_program_trips(fw, c).has_value());
  CHECK_FALSE(codegen::static_programs(fw, c).has_value());
  CHECK(codegen::trip_trend(fw, c, *launch_loops(fw)[1]) == 1);
  CHECK(codegen::trip_trend(kv, c, *launch_loops(kv)[1]) == -1);
}

TEST_CASE("program trips: longest_first walks shrinking programs from the first (the backward's key tiles) and growing ones from the last") {
  const Config c = cfg(R"({"blocks":{"m":64,"n":64},"num_warps":4,"knobs":{"longest_first":1}})");
  const std::string flip = "((long long)tj_n1 - 1 - (long long)((unsigned)tj_lf.m_tile))";
  const auto kv = codegen::generate_cuda(dkdv(1024, true), c, codegen::Target{});
  CHECK(kv.source.find(flip) != std::string::npos);
  const auto fw = codegen::generate_cuda(forward(1024, true), c, codegen::Target{});
  CHECK(fw.source.find("tj_lf.m_tile") != std::string::npos);
  CHECK(fw.source.find(flip) == std::string::npos);
}
