// codegen/mask_bounds: tile loops bounded by the tiles their mask keeps, where the tiles it rules
// out change nothing.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda_emitter.h"
#include "codegen/mask_bounds.h"
#include "codegen/program_trips.h"
#include "dsl/kernel.h"
#include "dsl/passes.h"
#include "examples/kernels/user_kernels.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_variants.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

const std::vector<int64_t> kShape = {1, 2, 100, 32};

// The backward kernel's arguments (q, k, v, do, lse, delta, outputs, scale, causal, the variant's inputs).
std::vector<ArgSpec> backward_specs(bool dkdv, bool causal, const std::vector<TensorSpec>& inputs = {}) {
  const TensorSpec t16{DType::bf16, kShape}, t32{DType::f32, {kShape[0], kShape[1], kShape[2]}};
  std::vector<ArgSpec> s = {t16, t16, t16, t16, t32, t32, t16};
  if (dkdv) s.push_back(t16);
  s.push_back(RuntimeScalar{0.2f});
  s.push_back(causal);
  for (const TensorSpec& t : inputs) s.push_back(t);
  return s;
}

// The non-launch loops' bounds (begin, end value ids), in trace order.
std::vector<std::pair<int, int>> loop_bounds(const ir::Function& f) {
  std::vector<std::pair<int, int>> out;
  ir::walk(f.body, [&](const ir::Op& op, int) {
    if (op.kind == ir::OpKind::loop && !op.launch) out.emplace_back(op.operands[0], op.operands[1]);
  });
  return out;
}

// Runs each function on the CPU reference executor with the same random inputs (integer inputs:
// `ints`, repeated; outputs poisoned) and returns every output's values.
std::vector<std::vector<double>> outputs_on_reference(const std::vector<const ir::Function*>& fns, const Config& cfg,
                                                      const std::vector<int64_t>& ints = {}) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0, 1);
  const ir::Function& f0 = *fns.front();
  std::vector<HostTensor> ins;
  for (const ir::Param& p : f0.params) {
    if (!p.is_tensor() || p.writes()) continue;
    HostTensor h(p.dtype, p.static_shape);
    for (int64_t i = 0; i < h.numel(); ++i)
      h.set(i, is_int(p.dtype) ? static_cast<double>(ints.at(static_cast<size_t>(i) % ints.size())) : normal(rng) + (p.name == "lse" ? 6 : 0));
    ins.push_back(std::move(h));
  }
  std::vector<std::vector<double>> got;
  for (const ir::Function* f : fns) {
    std::vector<HostTensor> outs;
    std::vector<ArgValue> args;
    size_t in = 0;
    for (const ir::Param& p : f->params) {
      if (!p.is_tensor()) {
        args.emplace_back(0.2f);
      } else if (p.writes()) {
        outs.emplace_back(p.dtype, p.static_shape);
        outs.back().fill_bytes(0xFF);
      }
    }
    size_t out = 0;
    for (const ir::Param& p : f->params) {
      if (!p.is_tensor()) continue;
      if (p.writes()) args.insert(args.begin() + static_cast<long>(&p - f->params.data()), outs[out++].view());
      else args.insert(args.begin() + static_cast<long>(&p - f->params.data()), ins[in++].view());
    }
    run_reference(*f, cfg, args);
    std::vector<double> values;
    for (const HostTensor& h : outs)
      for (double x : h.values()) values.push_back(x);
    got.push_back(std::move(values));
  }
  return got;
}

bool any_nan(const std::vector<double>& xs) {
  return std::any_of(xs.begin(), xs.end(), [](double x) { return std::isnan(x); });
}

const Config kBlocks = Config::from_json(R"({"blocks":{"m":16,"n":32}})");

}  // namespace

TEST_CASE("mask_bounds: a sliding window's backward loops run from the first to the last tile the window keeps") {
  const kernels::VariantBackward vb = kernels::attention_variant_backward(kernels::sliding_window_variant(24));
  for (bool causal : {false, true})
    for (bool dkdv : {true, false}) {
      CAPTURE(causal);
      CAPTURE(dkdv);
      const ir::Function f = (dkdv ? vb.dkdv : vb.dq).trace(backward_specs(dkdv, causal));
      int bounded = 0;
      const ir::Function g = codegen::bound_masked_loops(f, kBlocks, &bounded);
      CHECK(bounded == 1);
      passes::verify(g);
      const auto before = loop_bounds(f), after = loop_bounds(g);
      REQUIRE(before.size() == 1);
      REQUIRE(after.size() == 1);
      // dK / dV (query tiles for a key tile): the causal kernel starts at the key tile already,
      // so only its end moves. dQ (key tiles for a query tile): the causal kernel ends at the
      // query tile's end already, so only its start moves. Without causal both come from the mask.
      CHECK((after[0].first != before[0].first) == (!causal || !dkdv));
      CHECK((after[0].second != before[0].second) == (!causal || dkdv));
      const auto got = outputs_on_reference({&f, &g}, kBlocks);
      CHECK_FALSE(any_nan(got[0]));
      CHECK(got[0] == got[1]);   // the tiles left out added exact zeros
      if (dkdv && !causal) {
        // Key tile 0 (keys 0-31) is seen by queries 0-54: query tiles 0, 16, 32, 48 of 16 rows, of
        // the 7 tiles of S 100; the last key tile (96-99) by its own query tile only.
        CHECK(codegen::longest_program_trips(f, kBlocks) == 7);
        CHECK(codegen::longest_program_trips(g, kBlocks) == 4);
      }
    }
}

TEST_CASE("mask_bounds: masks of several shapes: the bounded loops compute the same outputs bit for bit on the CPU reference") {
  struct Case {
    const char* what;
    kernels::AttentionVariant variant;
    bool causal;
    std::vector<TensorSpec> inputs;
    std::vector<int64_t> ints;
    int64_t most_trips = 0;   // > 0: dK / dV's longest bounded loop (of 7 query tiles over S 100)
  };
  kernels::AttentionVariant lag{"attention_test_lag_40"};   // rows before 40 see no key: empty loops
  lag.mask_mod = [](const kernels::ScoreIndex& at) { return at.kv + 40 <= at.q; };
  kernels::AttentionVariant band{"attention_test_band"};     // not causal: keys within 20 either side
  band.mask_mod = [](const kernels::ScoreIndex& at) { return !(at.q - at.kv > 20 || at.kv - at.q > 20); };
  kernels::AttentionVariant scaled{"attention_test_scaled_positions"};   // positions times constants
  scaled.mask_mod = [](const kernels::ScoreIndex& at) { return at.kv * 2 <= at.q * 2 && at.q * 3 - at.kv * 3 < 90; };
  const std::vector<Case> cases = {
      {"causal as a hook, loops from 0", kernels::causal_variant(), false, {}, {}},
      {"window 24, shifted by 7", kernels::shifted_window_variant(24, 7), false, {}, {}},
      {"prefix-LM with a prefix per batch entry", kernels::prefix_lm_variant(), false, {TensorSpec{DType::i32, {1}}}, {37}},
      {"prefix-LM, a prefix past the sequence", kernels::prefix_lm_variant(), false, {TensorSpec{DType::i32, {1}}}, {500}},
      {"rows that see no key", lag, false, {}, {}},
      {"a band, through ! and ||", band, false, {}, {}},
      {"segments of 32 (floordiv of the positions)", kernels::segment_variant(32), false, {}, {}, 2},
      {"segments of 24, causal", kernels::segment_variant(24, true), false, {}, {}},
      {"documents (boundaries 40 and 70), causal", kernels::document_variant(3, true), true, {TensorSpec{DType::i32, {4}}}, {0, 40, 70, 100}},
      {"documents (boundaries 40 and 70)", kernels::document_variant(3, false), false, {TensorSpec{DType::i32, {4}}}, {0, 40, 70, 100}},
      {"positions times constants (no bound from * 2 or * 3 of the index: kept whole)", scaled, false, {}, {}},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    const kernels::VariantBackward vb = kernels::attention_variant_backward(c.variant);
    for (bool dkdv : {true, false}) {
      CAPTURE(dkdv);
      const ir::Function f = (dkdv ? vb.dkdv : vb.dq).trace(backward_specs(dkdv, c.causal, c.inputs));
      int bounded = 0;
      const ir::Function g = codegen::bound_masked_loops(f, kBlocks, &bounded);
      passes::verify(g);
      if (what.find("no bound") == std::string::npos) CHECK(bounded == 1);
      if (c.most_trips && dkdv) CHECK(codegen::longest_program_trips(g, kBlocks).value_or(-1) == c.most_trips);
      const auto got = outputs_on_reference({&f, &g}, kBlocks, c.ints);
      CHECK_FALSE(any_nan(got[0]));
      CHECK(got[0] == got[1]);
    }
  }
}

TEST_CASE("mask_bounds: a user's sliding-window forward (online softmax, guarded running max) is bounded, same output") {
  const TensorSpec t{DType::bf16, kShape};
  const ir::Function f = examples::window_attention().trace({t, t, t, t, RuntimeScalar{0.2f}, int64_t{24}});
  int bounded = 0;
  const ir::Function g = codegen::bound_masked_loops(f, kBlocks, &bounded);
  CHECK(bounded == 1);
  passes::verify(g);
  const auto before = loop_bounds(f), after = loop_bounds(g);
  REQUIRE(after.size() == 1);
  CHECK(after[0].first != before[0].first);    // from the window's first tile
  CHECK(after[0].second == before[0].second);  // to the diagonal, as written
  const auto got = outputs_on_reference({&f, &g}, kBlocks);
  CHECK_FALSE(any_nan(got[0]));
  CHECK(got[0] == got[1]);
}

namespace {

// A window mask over scores s (f32 [m, n]) of query tile m and key tile n.
Tile window_mask(const TileIndex& m, const TileIndex& n, const Tile& s) {
  auto q_at = m.index().col(), kv_at = n.index().row();
  return where(kv_at <= q_at && q_at - kv_at < 24, s, -INFINITY);
}

// A window attention whose key loop also does `extra` with the masked scores.
Kernel masked_loop(const std::string& name, int extra) {
  return kernel(name, {"q", "k", "o", "rows"}, [extra](In q, In k, Out o, Out rows) {
    auto [B, H, S, D] = q.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) {
        Var l = zeros({m}, DType::f32);
        auto qt = q.load(b, h, m, all);
        for (auto n : tile(S, block("n"))) {
          auto s = window_mask(m, n, dot(qt, k.load(b, h, n, all).T()));
          if (extra == 0) l = l + sum(exp2(s), 1) + 1.0;                  // adds 1 where masked
          if (extra == 1) {                                               // a plain store where masked
            l = l + sum(exp2(s), 1);
            rows.store(b, h, m, l);
          }
          if (extra == 2) l = l + sum(exp2(s * -1.0), 1);                 // -inf * -1 = +inf: not 0
          if (extra == 3) l = l + sum(where(s > -INFINITY, s * 0.0, 1.0), 1);  // counts the masked
          if (extra == 4) l = maximum(l, amax(s, 1)) + 0.0;               // max(l, -inf) = l: bounded
        }
        o.store(b, h, m, l);
      }
    }
  });
}

}  // namespace

TEST_CASE("mask_bounds: a mask that reads an input at the loop's own index is not loop-invariant (no bound from it)") {
  const Kernel k = kernel("mask_bounds_test_indexed_limit", {"q", "k", "lim", "o"}, [](In q, In k, In lim, Out o) {
    auto [B, H, S, D] = q.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) {
        Var l = zeros({m}, DType::f32);
        auto qt = q.load(b, h, m, all);
        for (auto n : tile(S, block("n"))) {
          auto s = dot(qt, k.load(b, h, n, all).T());
          auto kv_at = n.index().row();
          s = where(kv_at < lim.load(n.begin()).to(DType::i32), s, -INFINITY);   // a limit per key tile
          l = l + sum(exp2(s * 0.01), 1);
        }
        o.store(b, h, m, l);
      }
    }
  });
  const TensorSpec t{DType::bf16, kShape}, r{DType::f32, {kShape[0], kShape[1], kShape[2]}}, lim{DType::i64, {kShape[2]}};
  const ir::Function f = k.trace({t, t, lim, r});
  int bounded = -1;
  const ir::Function g = codegen::bound_masked_loops(f, kBlocks, &bounded);
  passes::verify(g);
  CHECK(bounded == 0);
  std::vector<int64_t> limits(static_cast<size_t>(kShape[2]));
  for (size_t i = 0; i < limits.size(); ++i) limits[i] = static_cast<int64_t>((i * 37) % 100);
  const auto got = outputs_on_reference({&f, &g}, kBlocks, limits);
  CHECK(got[0] == got[1]);
}

TEST_CASE("mask_bounds: loops that would change something where the mask rules a tile out keep their bounds") {
  const TensorSpec t{DType::bf16, kShape}, r{DType::f32, {kShape[0], kShape[1], kShape[2]}};
  const char* what[] = {"adds 1", "stores", "exp2 of -inf times -1", "counts masked scores", "running max (bounded)"};
  for (int extra = 0; extra < 5; ++extra) {
    CAPTURE(what[extra]);
    const Kernel k = masked_loop(fmt::format("mask_bounds_test_{}", extra), extra);
    const ir::Function f = k.trace({t, t, r, r});
    int bounded = -1;
    const ir::Function g = codegen::bound_masked_loops(f, kBlocks, &bounded);
    CHECK(bounded == (extra == 4 ? 1 : 0));
    if (extra != 4) CHECK(ir::print(g) == ir::print(f));
  }
  // A mask gathered per element (a block mask's cells) bounds nothing here.
  const ir::Function cells = kernels::attention_variant_backward(kernels::block_mask_variant(16, 32))
                                 .dkdv.trace(backward_specs(true, false, {TensorSpec{DType::i32, {1, 1, 7, 4}}}));
  int bounded = -1;
  codegen::bound_masked_loops(cells, kBlocks, &bounded);
  CHECK(bounded == 0);
  // The causal backward without a variant: its loops start at the diagonal already.
  const ir::Function causal = kernels::attention_bwd_dkdv().trace(backward_specs(true, true));
  CHECK(ir::print(codegen::bound_masked_loops(causal, kBlocks, &bounded)) == ir::print(causal));
  CHECK(bounded == 0);
}

TEST_CASE("mask_bounds: the generated code runs the window's tiles (knob mask_bounds), or every tile (0)") {
  const TensorSpec t16{DType::bf16, {2, 4, 1024, 128}}, t32{DType::f32, {2, 4, 1024}};
  const kernels::VariantBackward vb = kernels::attention_variant_backward(kernels::sliding_window_variant(256));
  const ir::Function f = vb.dkdv.trace({t16, t16, t16, t16, t32, t32, t16, t16, RuntimeScalar{0.1f}, true});
  const std::string base = R"({"blocks":{"m":64,"n":128},"num_warps":8,"num_stages":2)";
  const auto on = codegen::generate_cuda(f, Config::from_json(base + "}"), codegen::Target{});
  const auto off = codegen::generate_cuda(f, Config::from_json(base + R"(,"knobs":{"mask_bounds":0}})"), codegen::Target{});
  INFO(on.source);
  // The query loop's end: the last tile within 256 + 127 rows of the key tile, at most S.
  CHECK(on.source.find("382LL") != std::string::npos);
  CHECK(off.source.find("382LL") == std::string::npos);
  CHECK(on.lowering == "tensor cores (wgmma)");
  // The causal backward's code is the same with the knob on or off (nothing to bound).
  const ir::Function c = kernels::attention_bwd_dkdv().trace({t16, t16, t16, t16, t32, t32, t16, t16, RuntimeScalar{0.1f}, true});
  auto body = [](const std::string& source) { return source.substr(source.find("extern \"C\"")); };   // past the config line
  CHECK(body(codegen::generate_cuda(c, Config::from_json(base + "}"), codegen::Target{}).source) ==
        body(codegen::generate_cuda(c, Config::from_json(base + R"(,"knobs":{"mask_bounds":0}})"), codegen::Target{}).source));
}
