// codegen/issue_early: the tensor-core lowerings' issue order. Loop bodies issue their input
// loads and leaf dots first; everything else keeps the user's order; values are unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_backward.h"
#include "backward_testing.h"
#include "codegen/issue_early.h"
#include "dsl/kernel.h"
#include "examples/kernels/user_kernels.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

const ir::Region& inner_body(const ir::Function& f) {
  const ir::Region* found = nullptr;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind == ir::OpKind::loop && !op.launch) found = op.body.get();
  });
  REQUIRE(found);
  return *found;
}

// Positions in `r` of the ops that satisfy `pred`, in order.
template <class P>
std::vector<int> where_in(const ir::Region& r, P pred) {
  std::vector<int> out;
  for (size_t i = 0; i < r.ops.size(); ++i)
    if (pred(r.ops[i])) out.push_back(static_cast<int>(i));
  return out;
}

ir::Function dkdv(bool causal, std::vector<int64_t> shape = {2, 4, 1024, 128}) {
  const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
  return kernels::attention_bwd_dkdv().trace({t16, t16, t16, t16, t32, t32, t16, t16, RuntimeScalar{0.1f}, causal});
}

}  // namespace

TEST_CASE("ir::clone copies a kernel whole: the same printed IR, loop bodies included") {
  for (bool causal : {false, true}) {
    const ir::Function f = dkdv(causal);
    CHECK(ir::print(ir::clone(f)) == ir::print(f));
  }
}

TEST_CASE("issue_early: the attention backward's dK / dV body issues its row loads and both leaf dots before the softmax") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const ir::Function f = dkdv(causal);
    bool moved = false;
    const ir::Function g = codegen::issue_early(f, &moved);
    CHECK(moved);
    const ir::Region& before = inner_body(f);
    const ir::Region& after = inner_body(g);
    REQUIRE(after.ops.size() == before.ops.size());
    auto is = [](ir::OpKind k) { return [k](const ir::Op& op) { return op.kind == k; }; };
    const std::vector<int> dots = where_in(after, is(ir::OpKind::dot));
    const std::vector<int> exps = where_in(after, [](const ir::Op& op) {
      return op.kind == ir::OpKind::unary && op.unary == ir::UnaryFn::exp2;
    });
    // lse and delta: the loads of f32 [B, H, S] rows (params 4 and 5).
    const std::vector<int> rows = where_in(after, [](const ir::Op& op) {
      return op.kind == ir::OpKind::load && (op.param == 4 || op.param == 5);
    });
    REQUIRE(dots.size() == 4);
    REQUIRE(exps.size() == 1);
    REQUIRE(rows.size() == 2);
    // S^T = k.q^T and dP^T = v.dO^T (no dot in their operands) first, then the chained dV and dK.
    CHECK(dots[1] < exps[0]);
    CHECK(dots[2] > exps[0]);
    CHECK(rows[1] < exps[0]);
    // In the user's order dP^T came after the softmax and dV.
    const std::vector<int> user_dots = where_in(before, is(ir::OpKind::dot));
    const std::vector<int> user_exps = where_in(before, [](const ir::Op& op) {
      return op.kind == ir::OpKind::unary && op.unary == ir::UnaryFn::exp2;
    });
    CHECK(user_dots[1] > user_exps[0]);
    // The leaf dots keep their order: S^T (operands k and q) before dP^T.
    CHECK(after.ops[dots[0]].loc.line == before.ops[user_dots[0]].loc.line);
  }
}

TEST_CASE("issue_early: kernels whose bodies have nothing to move are unchanged (README attention, GEMM)") {
  const std::vector<int64_t> shape = {1, 2, 256, 64};
  const TensorSpec x{DType::bf16, shape};
  for (bool causal : {false, true}) {
    const ir::Function f = examples::readme_attention().trace({x, x, x, x, RuntimeScalar{0.125f}, causal});
    bool moved = true;
    CHECK(ir::print(codegen::issue_early(f, &moved)) == ir::print(f));
    CHECK_FALSE(moved);
  }
  const ir::Function g = examples::gemm_bias_gelu(true).trace({TensorSpec{DType::bf16, {256, 128}}, TensorSpec{DType::bf16, {128, 64}},
                                                               TensorSpec{DType::f32, {64}}, TensorSpec{DType::bf16, {256, 64}}});
  CHECK(ir::print(codegen::issue_early(g)) == ir::print(g));
}

TEST_CASE("issue_early: a dot into a variable does not move above an earlier read of that variable") {
  // The body reads acc (for `seen`) before the dot accumulates into it: the dot's in-place
  // accumulation must not run first.
  Kernel kern = kernel("read_then_accumulate", {"a", "b", "c", "d"}, [](In a, In b, Out c, Out d) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        Var seen = zeros({m, n}, DType::f32);
        for (auto kk : tile(K, block("k"))) {
          seen = Tile(seen) + Tile(acc) * 0.5;
          acc = dot(a.load(m, kk), b.load(n, kk).T(), acc);
        }
        c.store(m, n, Tile(acc).to(c.dtype()));
        d.store(m, n, Tile(seen).to(d.dtype()));
      }
  });
  const ir::Function f = kern.trace({TensorSpec{DType::bf16, {128, 256}}, TensorSpec{DType::bf16, {64, 256}},
                                     TensorSpec{DType::bf16, {128, 64}}, TensorSpec{DType::bf16, {128, 64}}});
  CHECK(ir::print(codegen::issue_early(f)) == ir::print(f));
}

TEST_CASE("issue_early: the reordered backward computes the same gradients, bit for bit, on the CPU reference executor") {
  std::mt19937 rng(11);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const std::vector<int64_t> shape = {1, 2, 80, 32};
    const ir::Function f = dkdv(causal, shape), g = codegen::issue_early(f);
    const auto got = tj_test::dkdv_on_reference({&f, &g}, Config::from_json(R"({"blocks":{"m":16,"n":32}})"), shape, rng);
    CHECK(std::none_of(got[0].begin(), got[0].end(), [](double x) { return std::isnan(x); }));
    CHECK(got[0] == got[1]);
  }
}
