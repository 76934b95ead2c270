// codegen/prefetch_loads: vectors that a loop loads at its own tile, loaded one iteration ahead
// through a loop-carried variable.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backward_testing.h"
#include "codegen/cuda_emitter.h"
#include "codegen/prefetch_loads.h"
#include "dsl/kernel.h"
#include "examples/kernels/user_kernels.h"
#include "kernels/attention_backward.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

ir::Function dkdv(bool causal, std::vector<int64_t> shape) {
  const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
  return kernels::attention_bwd_dkdv().trace({t16, t16, t16, t16, t32, t32, t16, t16, RuntimeScalar{0.1f}, causal});
}

const ir::Op& inner_loop(const ir::Function& f) {
  const ir::Op* found = nullptr;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind == ir::OpKind::loop && !op.launch) found = &op;
  });
  REQUIRE(found);
  return *found;
}

size_t count(const ir::Region& r, ir::OpKind k) {
  return static_cast<size_t>(std::count_if(r.ops.begin(), r.ops.end(), [k](const ir::Op& op) { return op.kind == k; }));
}

}  // namespace

TEST_CASE("prefetch_loads: the backward's LSE and delta rows load one query tile ahead, into variables") {
  const ir::Function f = dkdv(true, {2, 4, 1024, 128});
  bool moved = false;
  const ir::Function g = codegen::prefetch_loads(f, &moved);
  CHECK(moved);
  const ir::Op& loop = inner_loop(g);
  // Both rows (params 4 and 5): loaded at begin before the loop, at index + block inside it.
  std::vector<const ir::Op*> inside;
  for (const ir::Op& op : loop.body->ops)
    if (op.kind == ir::OpKind::load && (op.param == 4 || op.param == 5)) inside.push_back(&op);
  REQUIRE(inside.size() == 2);
  for (const ir::Op* l : inside) {
    CHECK(std::find(l->operands.begin(), l->operands.end(), loop.body_index) == l->operands.end());
  }
  CHECK(count(*loop.body, ir::OpKind::var_read) >= 2);
  CHECK(count(*loop.body, ir::OpKind::var_write) >= 2);
  // The variables' writes come last: this tile's values are read before the next tile's land.
  CHECK(loop.body->ops.back().kind == ir::OpKind::var_write);
  // The staged operands (q, do) stay where they are: only dots read them.
  CHECK(count(*loop.body, ir::OpKind::load) == count(*inner_loop(f).body, ir::OpKind::load));
}

TEST_CASE("prefetch_loads: kernels without such loads are unchanged (README attention, the dQ kernel's rows loaded per program)") {
  const TensorSpec x{DType::bf16, {1, 2, 256, 64}}, r{DType::f32, {1, 2, 256}};
  for (bool causal : {false, true}) {
    const ir::Function fw = examples::readme_attention().trace({x, x, x, x, RuntimeScalar{0.125f}, causal});
    bool moved = true;
    CHECK(ir::print(codegen::prefetch_loads(fw, &moved)) == ir::print(fw));
    CHECK_FALSE(moved);
    const ir::Function dq = kernels::attention_bwd_dq().trace({x, x, x, x, r, r, x, RuntimeScalar{0.1f}, causal});
    CHECK(ir::print(codegen::prefetch_loads(dq, &moved)) == ir::print(dq));
    CHECK_FALSE(moved);
  }
}

TEST_CASE("prefetch_loads: the carried backward computes the same gradients, bit for bit, on the CPU reference executor (ragged tail)") {
  std::mt19937 rng(13);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    // Query tiles of 32: 0, 32, 64 (16 rows); the load ahead at 96 is past the end.
    const std::vector<int64_t> shape = {1, 2, 80, 32};
    const ir::Function f = dkdv(causal, shape), g = codegen::prefetch_loads(f);
    const auto got = tj_test::dkdv_on_reference({&f, &g}, Config::from_json(R"({"blocks":{"m":32,"n":16}})"), shape, rng);
    CHECK(std::none_of(got[0].begin(), got[0].end(), [](double x) { return std::isnan(x); }));
    CHECK(got[0] == got[1]);
  }
}

TEST_CASE("prefetch_loads: the generated dK / dV kernel loads the next tile's rows (knob prefetch_loads), or where the user did (0)") {
  const ir::Function f = dkdv(false, {2, 4, 1024, 128});
  const std::string base = R"({"blocks":{"m":32,"n":128},"num_warps":8,"num_stages":4)";
  const auto on = codegen::generate_cuda(f, Config::from_json(base + "}"), codegen::Target{});
  const auto off = codegen::generate_cuda(f, Config::from_json(base + R"(,"knobs":{"prefetch_loads":0}})"), codegen::Target{});
  INFO(on.source);
  CHECK(on.source.find(" + 32LL;") != std::string::npos);
  CHECK(off.source.find(" + 32LL;") == std::string::npos);
  // The index ahead is clamped to the last tile's start: every tile of the loop is whole here, and
  // so are the loads ahead (no bounds checks: the loads' template argument CC false).
  CHECK(on.source.find("tj::dev::load<tj::dev::f32, M1x32, false, true>") == std::string::npos);
}
