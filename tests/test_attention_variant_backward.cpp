// The backward of attention variants (kernels/attention_backward.h, attention_variant_backward):
// the variants' hooks traced into the backward kernels, on the CPU reference executor against
// float64 gradients of the same meaning (score_mod with its derivative, masks, rows that see no
// key), compiled for sm_90a with every dot on wgmma, and its errors.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <regex>

#include "backward_testing.h"
#include "codegen/cuda_emitter.h"
#include "codegen/lowering.h"
#include "core/error.h"
#include "gpu.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variants.h"
#include "kernels/library.h"
#include "nvrtc_testing.h"
#include "runtime/owned_tensor.h"

using namespace tj;
using tj_test::Grads;
using tj_test::random;
using tj_test::rel_rmse;
using Meaning = tj_test::ScoreMeaning;

namespace {

struct Case {
  const char* what;
  kernels::AttentionVariant variant;
  Meaning meaning;
  bool causal = false;                      // the launch's causal flag
  std::vector<HostTensor> inputs = {};      // the variant's extra inputs
};

}  // namespace

namespace {

// The variants of kernels/attention_variants.h (and a user's with rows that see no key) with their
// float64 meaning, H heads of S positions; softcap's cap `cap`, the prefix 37 and the window 24
// positions.
std::vector<Case> variant_cases(int64_t H, double cap) {
  auto alibi_slope = [H](int64_t h) { return std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(H)); };
  HostTensor prefix(DType::i32, {1});
  prefix.set(0, 37.0);
  // A user's variant: rows 3, 10, 17, ... see no key at all (their lse is -inf), the rest causal.
  kernels::AttentionVariant holes{"attention_test_holes"};
  holes.mask_mod = [](const kernels::ScoreIndex& at) { return at.kv <= at.q && at.q % 7 != 3; };
  std::vector<Case> cases;
  cases.push_back({"alibi, causal flag", kernels::alibi_variant(H, true),
                   {[=](double s, int64_t h, int64_t i, int64_t j) { return s + alibi_slope(h) * static_cast<double>(j - i); },
                    [](double, int64_t, int64_t, int64_t) { return 1.0; }, [](int64_t i, int64_t j) { return j <= i; }},
                   true});
  cases.push_back({"softcap, causal in the mask only", kernels::softcap_variant(cap, true),
                   {[=](double s, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); },
                    [=](double s, int64_t, int64_t, int64_t) { return 1.0 - std::tanh(s / cap) * std::tanh(s / cap); },
                    [](int64_t i, int64_t j) { return j <= i; }},
                   false});
  cases.push_back({"softcap, not causal", kernels::softcap_variant(cap, false),
                   {[=](double s, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); },
                    [=](double s, int64_t, int64_t, int64_t) { return 1.0 - std::tanh(s / cap) * std::tanh(s / cap); }},
                   false});
  Meaning window;
  window.keep = [](int64_t i, int64_t j) { return j <= i && i - j < 24; };
  cases.push_back({"sliding window 24", kernels::sliding_window_variant(24), window, true});
  Meaning prefix_lm;
  prefix_lm.keep = [](int64_t i, int64_t j) { return j <= i || j < 37; };
  cases.push_back({"prefix-LM, an input", kernels::prefix_lm_variant(), prefix_lm, false, {prefix}});
  Meaning holes_m;
  holes_m.keep = [](int64_t i, int64_t j) { return j <= i && i % 7 != 3; };
  cases.push_back({"rows without keys", holes, holes_m, true});
  return cases;
}

// Random bf16 q, k, v, dO of `shape` and the float64 forward (o, natural-log lse) and gradients of
// `m` on them.
struct Problem {
  HostTensor q, k, v, dout;
  std::vector<double> o, lse;
  Grads want;
};
Problem make_problem(const std::vector<int64_t>& shape, double scale_nat, const Meaning& m, std::mt19937& rng) {
  Problem p{random(DType::bf16, shape, rng), random(DType::bf16, shape, rng), random(DType::bf16, shape, rng),
            random(DType::bf16, shape, rng), {}, {}, {}};
  tj_test::reference_attention(p.q, p.k, p.v, p.dout, m, scale_nat, p.o, p.lse, p.want);
  return p;
}

}  // namespace

TEST_CASE("attention variant backward on the CPU reference: float64 gradients of score_mods (with their derivative), masks "
          "and rows that see no key") {
  constexpr int64_t H = 2, S = 80, D = 32;
  const std::vector<int64_t> shape = {1, H, S, D}, rows = {1, H, S};
  const double scale_nat = 0.25;   // scores of about N(0, 1.4): a softcap of 2 bends them
  std::mt19937 rng(23);
  for (Case& c : variant_cases(H, 2.0)) {
    CAPTURE(c.what);
    Problem p = make_problem(shape, scale_nat, c.meaning, rng);
    HostTensor &q = p.q, &k = p.k, &v = p.v, &dout = p.dout;
    const Grads& want = p.want;
    HostTensor o = HostTensor::from_values(p.o, DType::bf16, shape), lse = HostTensor::from_values(p.lse, DType::f32, rows);
    HostTensor delta(DType::f32, rows), lse2(DType::f32, rows), dq(DType::f32, shape), dk(DType::bf16, shape), dv(DType::bf16, shape);
    for (HostTensor* t : {&delta, &lse2, &dq, &dk, &dv}) t->fill_bytes(0xFF);   // poison
    const kernels::VariantBackward vb = kernels::attention_variant_backward(c.variant);
    kernels::AttentionBackwardOptions opt;
    opt.causal = c.causal;
    opt.softmax_scale = scale_nat;
    opt.variant = &vb;
    for (HostTensor& in : c.inputs) opt.variant_inputs.push_back(in.view());
    tj_test::run_launches(kernels::attention_backward_launches(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), dq.view(),
                                                               dk.view(), dv.view(), opt, delta.view(), lse2.view(), std::nullopt));
    bool finite = true;
    for (const HostTensor* t : {&dq, &dk, &dv})
      for (int64_t i = 0; i < t->numel(); ++i) finite &= std::isfinite(t->at(i));
    CHECK(finite);
    CHECK(rel_rmse(dv, want.dv) < 2e-2);
    CHECK(rel_rmse(dk, want.dk) < 3e-2);
    CHECK(rel_rmse(dq, want.dq) < 2e-2);
  }
}

TEST_CASE("attention variant backward on the CPU reference: grouped-query heads (each query head's share, summed per kv head) "
          "with ALiBi's per-head slopes") {
  constexpr int64_t H = 4, Hkv = 2, S = 72, D = 32;
  const std::vector<int64_t> shape = {1, H, S, D}, kv = {1, Hkv, S, D}, rows = {1, H, S}, part = {1, H, S, D};
  const double scale_nat = 0.25;
  std::mt19937 rng(31);
  auto slope = [](int64_t h) { return std::exp2(-8.0 * static_cast<double>(h + 1) / H); };
  Meaning m;
  m.mod = [=](double s, int64_t h, int64_t i, int64_t j) { return s + slope(h) * static_cast<double>(j - i); };
  m.keep = [](int64_t i, int64_t j) { return j <= i; };
  HostTensor q = random(DType::bf16, shape, rng), k = random(DType::bf16, kv, rng), v = random(DType::bf16, kv, rng),
             dout = random(DType::bf16, shape, rng);
  std::vector<double> o64, lse64;
  Grads want;
  tj_test::reference_attention(q, k, v, dout, m, scale_nat, o64, lse64, want);
  HostTensor o = HostTensor::from_values(o64, DType::bf16, shape), lse = HostTensor::from_values(lse64, DType::f32, rows);
  HostTensor delta(DType::f32, rows), lse2(DType::f32, rows), dq(DType::f32, shape), dk(DType::f32, kv), dv(DType::f32, kv),
      dk_part(DType::f32, part), dv_part(DType::f32, part);
  for (HostTensor* t : {&delta, &lse2, &dq, &dk, &dv, &dk_part, &dv_part}) t->fill_bytes(0xFF);   // poison
  const kernels::VariantBackward vb = kernels::attention_variant_backward(kernels::alibi_variant(H, true));
  kernels::AttentionBackwardOptions opt;
  opt.causal = true;
  opt.softmax_scale = scale_nat;
  opt.variant = &vb;
  tj_test::run_launches(kernels::attention_backward_launches(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), dq.view(),
                                                             dk.view(), dv.view(), opt, delta.view(), lse2.view(), std::nullopt,
                                                             dk_part.view(), dv_part.view()));
  CHECK(rel_rmse(dv, want.dv) < 2e-2);
  CHECK(rel_rmse(dk, want.dk) < 3e-2);
  CHECK(rel_rmse(dq, want.dq) < 2e-2);
}

TEST_CASE("attention variant backward: every dot on wgmma for sm_90a, spills bounded, a fast_math variant on tanh.approx") {
  const std::vector<int64_t> shape = {2, 4, 1024, 128};
  const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
  for (const kernels::AttentionVariant& var : {kernels::alibi_variant(4, true), kernels::softcap_variant(30.0, true),
                                               kernels::sliding_window_variant(256), kernels::learnable_alibi_variant(true)}) {
    const kernels::VariantBackward vb = kernels::attention_variant_backward(var);
    for (const Kernel* k : {&vb.dkdv, &vb.dq}) {
      std::vector<ArgSpec> specs = {t16, t16, t16, t16, t32, t32, t16};
      if (k == &vb.dkdv) specs.push_back(t16);
      specs.push_back(RuntimeScalar{0.1f});
      specs.push_back(true);
      const TensorSpec heads{DType::f32, {shape[1]}};   // learnable slopes, and (dK / dV) their gradient
      for (size_t i = 0; i < var.inputs.size() + (k == &vb.dkdv ? var.learnable.size() : 0); ++i) specs.push_back(heads);
      const ir::Function f = k->trace(specs);
      const Config c = codegen::untuned_config(f, "sm_90a");
      CAPTURE(f.name);
      CAPTURE(c.to_json());
      CHECK(c.knobs.count("fast_math") == (var.fast_math ? 1u : 0u));
      const auto g = codegen::generate_cuda(f, c, codegen::Target::parse("sm_90a"));
      INFO(g.source);
      CHECK(g.lowering == "tensor cores (wgmma)");
      const auto r = tj_test::nvrtc(g, "sm_90a", true, true);
      CHECK(std::regex_search(r.ptx, std::regex(R"(wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16)")));
      INFO(r.log);
      // A softcap's derivative is one more f32 tile of the scores alive across dP's product: the
      // dK / dV kernel spills a few words (84 bytes at 32 x 128 tiles with overlap 2); learnable
      // slopes' d modded / d slope times dS is one more (104 bytes; 0 at 16 x 128 tiles).
      const bool one_more_tile = k == &vb.dkdv && ((var.score_grad && var.fast_math) || !var.learnable.empty());
      CHECK(tj_test::ptxas_info(r.log).spill_stores <= (one_more_tile ? 128 : 0));
      CHECK(r.log.find("serialized") == std::string::npos);
      if (var.fast_math) CHECK(r.ptx.find("tanh.approx.f32") != std::string::npos);
    }
  }
}

TEST_CASE("attention variant backward: errors name the variant and what is missing") {
  kernels::AttentionVariant no_grad{"attention_test_no_grad"};
  no_grad.score_mod = [](const Tile& s, const kernels::ScoreIndex&) { return s * 2.0; };
  CHECK_THROWS_WITH_AS(kernels::attention_variant_backward(no_grad),
                       doctest::Contains("'attention_test_no_grad' has a score_mod without a score_grad"), Error);
  CHECK_THROWS_WITH_AS(kernels::attention_variant_backward(kernels::AttentionVariant{}), doctest::Contains("needs a name"), Error);
  kernels::AttentionVariant merging = kernels::causal_variant();
  merging.name = "attention_test_merging";
  merging.merge_into_output = true;
  CHECK_THROWS_WITH_AS(kernels::attention_variant_backward(merging), doctest::Contains("merges into its output: the backward takes the non-merging variant"), Error);

  const std::vector<int64_t> shape = {1, 2, 64, 32}, rows = {1, 2, 64};
  HostTensor q(DType::bf16, shape), o(DType::bf16, shape), lse(DType::f32, rows), dq(DType::bf16, shape), delta(DType::f32, rows),
      lse2(DType::f32, rows);
  const kernels::VariantBackward prefix = kernels::attention_variant_backward(kernels::prefix_lm_variant());
  kernels::AttentionBackwardOptions opt;
  opt.variant = &prefix;
  auto launches = [&] {
    return kernels::attention_backward_launches(q.view(), q.view(), q.view(), o.view(), o.view(), lse.view(), dq.view(), dq.view(),
                                                dq.view(), opt, delta.view(), lse2.view(), std::nullopt);
  };
  CHECK_THROWS_WITH_AS(launches(), doctest::Contains("variant 'attention_prefix_lm': it takes 1 extra input(s) (the forward's), got 0"),
                       Error);
  opt.variant_inputs = {lse.view()};
  opt.deterministic = false;
  HostTensor acc(DType::f32, shape);
  CHECK_THROWS_WITH_AS(kernels::attention_backward_launches(q.view(), q.view(), q.view(), o.view(), o.view(), lse.view(), dq.view(),
                                                            dq.view(), dq.view(), opt, delta.view(), lse2.view(), acc.view()),
                       doctest::Contains("three kernels only"), Error);
  opt.deterministic = true;
  CHECK_NOTHROW(launches());
  opt.variant = nullptr;
  CHECK_THROWS_WITH_AS(launches(), doctest::Contains("variant inputs or parameter gradients given without a variant"), Error);
}

namespace {

// ALiBi with slopes `slopes` (natural-log units per position), causal, as float64 meaning.
Meaning learnable_alibi(const std::vector<double>& slopes) {
  Meaning m;
  m.mod = [slopes](double s, int64_t h, int64_t i, int64_t j) { return s + slopes[h] * static_cast<double>(j - i); };
  m.keep = [](int64_t i, int64_t j) { return j <= i; };
  return m;
}

}  // namespace

namespace {

// Random bf16 inputs (q [1, H, S, D], k and v with Hkv heads), slopes, and in float64: the forward
// (o, lse), the gradients, and d loss / d slope[h] for loss = sum(dout * o): by central differences,
// and as the backward computes it from the bf16 o it is given, sum over i, j of P (dP - delta) (j -
// i) with delta = rowsum(dout * o): o's rounding to bf16 moves delta, and through the weights j - i
// (up to S) a slope's gradient by up to ~10% where it is small (numpy, S 72: -5.43 vs -5.90).
struct LearnableProblem {
  HostTensor q, k, v, dout, slopes;
  std::vector<double> o, lse, dslopes, dslopes_bf16_o;
  Grads want;
};
LearnableProblem learnable_problem(int64_t H, int64_t Hkv, int64_t S, int64_t D, double scale_nat, std::mt19937& rng) {
  std::vector<double> slopes(H);
  for (int64_t h = 0; h < H; ++h) slopes[h] = 0.3 * std::sin(1.7 * static_cast<double>(h + 1));   // both signs
  LearnableProblem p{random(DType::bf16, {1, H, S, D}, rng), random(DType::bf16, {1, Hkv, S, D}, rng),
                     random(DType::bf16, {1, Hkv, S, D}, rng), random(DType::bf16, {1, H, S, D}, rng),
                     HostTensor::from_values(slopes, DType::f32, {H}), {}, {}, {}, {}};
  tj_test::reference_attention(p.q, p.k, p.v, p.dout, learnable_alibi(slopes), scale_nat, p.o, p.lse, p.want);
  auto loss = [&](const std::vector<double>& s) {
    std::vector<double> o, lse;
    Grads unused;
    tj_test::reference_attention(p.q, p.k, p.v, p.dout, learnable_alibi(s), scale_nat, o, lse, unused);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += p.dout.at(static_cast<int64_t>(i)) * o[i];
    return l;
  };
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> up = slopes, down = slopes;
    up[h] += 1e-5;
    down[h] -= 1e-5;
    p.dslopes.push_back((loss(up) - loss(down)) / 2e-5);
  }
  const std::vector<double> o16 = HostTensor::from_values(p.o, DType::bf16, {1, H, S, D}).values();
  for (int64_t h = 0; h < H; ++h) {
    const int64_t hk = h / (H / Hkv);
    double g = 0;
    for (int64_t i = 0; i < S; ++i) {
      double delta = 0;
      for (int64_t d = 0; d < D; ++d) delta += p.dout.at((h * S + i) * D + d) * o16[(h * S + i) * D + d];
      for (int64_t j = 0; j <= i; ++j) {
        double qk = 0, dp = 0;
        for (int64_t d = 0; d < D; ++d) {
          qk += p.q.at((h * S + i) * D + d) * p.k.at((hk * S + j) * D + d);
          dp += p.dout.at((h * S + i) * D + d) * p.v.at((hk * S + j) * D + d);
        }
        const double P = std::exp(qk * scale_nat + slopes[h] * static_cast<double>(j - i) - p.lse[h * S + i]);
        g += P * (dp - delta) * static_cast<double>(j - i);
      }
    }
    p.dslopes_bf16_o.push_back(g);
  }
  return p;
}

}  // namespace

TEST_CASE("attention variant backward on the CPU reference: learnable ALiBi slopes, their gradient against float64 finite "
          "differences of the loss (grouped-query heads)") {
  constexpr int64_t H = 4, Hkv = 2, S = 72, D = 32;
  const std::vector<int64_t> shape = {1, H, S, D}, kv = {1, Hkv, S, D}, rows = {1, H, S}, part = {1, H, S, D};
  const double scale_nat = 0.25;
  std::mt19937 rng(41);
  LearnableProblem p = learnable_problem(H, Hkv, S, D, scale_nat, rng);
  HostTensor o = HostTensor::from_values(p.o, DType::bf16, shape), lse = HostTensor::from_values(p.lse, DType::f32, rows);
  HostTensor delta(DType::f32, rows), lse2(DType::f32, rows), dq(DType::f32, shape), dk(DType::f32, kv), dv(DType::f32, kv),
      dk_part(DType::f32, part), dv_part(DType::f32, part), dslopes(DType::f32, {H});
  for (HostTensor* t : {&delta, &lse2, &dq, &dk, &dv, &dk_part, &dv_part, &dslopes}) t->fill_bytes(0xFF);   // poison
  const kernels::VariantBackward vb = kernels::attention_variant_backward(kernels::learnable_alibi_variant(true));
  CHECK(vb.learnable == 1);
  kernels::AttentionBackwardOptions opt;
  opt.causal = true;
  opt.softmax_scale = scale_nat;
  opt.variant = &vb;
  opt.variant_inputs = {p.slopes.view()};
  opt.variant_param_grads = {dslopes.view()};
  tj_test::run_launches(kernels::attention_backward_launches(p.q.view(), p.k.view(), p.v.view(), o.view(), p.dout.view(), lse.view(),
                                                             dq.view(), dk.view(), dv.view(), opt, delta.view(), lse2.view(),
                                                             std::nullopt, dk_part.view(), dv_part.view()));
  CHECK(rel_rmse(dv, p.want.dv) < 2e-2);
  CHECK(rel_rmse(dk, p.want.dk) < 3e-2);
  CHECK(rel_rmse(dq, p.want.dq) < 2e-2);
  INFO("dslopes ", fmt::format("{}", fmt::join(dslopes.values(), ", ")), " float64 ", fmt::format("{}", fmt::join(p.dslopes, ", ")),
       " from the bf16 o ", fmt::format("{}", fmt::join(p.dslopes_bf16_o, ", ")));
  CHECK(rel_rmse(dslopes, p.dslopes_bf16_o) < 1e-4);
  CHECK(rel_rmse(dslopes, p.dslopes) < 8e-2);
  for (double d : p.dslopes) CHECK(std::abs(d) > 1e-2);   // a gradient the check can see
}

namespace {

// attention_backward's FP8 operands of q, k, v, dout, made by its own quantizers (chunk_amax, then
// quantize_fp8_both_chunked: e4m3 per (b, h), the transposed copies padded to 16 keys) on the CPU
// reference executor.
struct Quantized {
  HostTensor y, yt, descale;
};
Quantized quantize_on_reference(const HostTensor& x) {
  const auto& sh = x.shape();
  HostTensor partial(DType::f32, {sh[0], sh[1], 1});
  Quantized q{HostTensor(DType::e4m3, sh), HostTensor(DType::e4m3, {sh[0], sh[1], sh[3], (sh[2] + 15) / 16 * 16}),
              HostTensor(DType::f32, {sh[0], sh[1]})};
  tj_test::run_launches({{&kernels::chunk_amax(), {x.view(), partial.view()}},
                         {&kernels::quantize_fp8_both_chunked(), {x.view(), partial.view(), q.y.view(), q.yt.view(), q.descale.view()}}});
  return q;
}
struct HostFp8 {
  Quantized q, k, v, dout;
  kernels::BackwardFp8Views views() const {
    return {q.y.view(), q.yt.view(), k.y.view(), k.yt.view(), v.y.view(), dout.y.view(), dout.yt.view(),
            q.descale.view(), k.descale.view(), v.descale.view(), dout.descale.view()};
  }
};
HostFp8 fp8_operands(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout) {
  return {quantize_on_reference(q), quantize_on_reference(k), quantize_on_reference(v), quantize_on_reference(dout)};
}

}  // namespace

TEST_CASE("attention variant backward FP8 on the CPU reference: the causal variant's kernels equal the causal FP8 kernels bit "
          "for bit, ALiBi (learnable slopes too) and a window within the FP8 recipe's error of float64") {
  constexpr int64_t H = 2, S = 96, D = 64;
  const std::vector<int64_t> shape = {1, H, S, D}, rows = {1, H, S};
  const double scale_nat = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937 rng(47);
  const std::vector<double> slopes = {0.2, -0.15};
  Meaning causal_m;
  causal_m.keep = [](int64_t i, int64_t j) { return j <= i; };
  HostTensor slope_t = HostTensor::from_values(slopes, DType::f32, {H});
  struct Fp8Case {
    const char* what;
    kernels::AttentionVariant variant;
    Meaning meaning;
    bool causal;
    std::vector<HostTensor*> inputs;
  };
  Meaning window;
  window.keep = [](int64_t i, int64_t j) { return j <= i && i - j < 24; };
  const std::vector<Fp8Case> cases = {{"causal as a hook", kernels::causal_variant(), causal_m, false, {}},
                                      {"window 24", kernels::sliding_window_variant(24), window, true, {}},
                                      {"learnable ALiBi", kernels::learnable_alibi_variant(true), learnable_alibi(slopes), true, {&slope_t}}};
  for (const Fp8Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    Problem p = make_problem(shape, scale_nat, c.meaning, rng);
    const HostTensor o = HostTensor::from_values(p.o, DType::bf16, shape), lse = HostTensor::from_values(p.lse, DType::f32, rows);
    const HostFp8 f8 = fp8_operands(p.q, p.k, p.v, p.dout);
    auto run = [&](const kernels::VariantBackward* vb, bool causal, HostTensor* dslopes) {
      HostTensor delta(DType::f32, rows), lse2(DType::f32, rows), dq(DType::f32, shape), dk(DType::f32, shape), dv(DType::f32, shape);
      for (HostTensor* t : {&delta, &lse2, &dq, &dk, &dv}) t->fill_bytes(0xFF);   // poison
      kernels::AttentionBackwardOptions opt;
      opt.fp8 = true;
      opt.causal = causal;
      opt.softmax_scale = scale_nat;
      opt.variant = vb;
      if (vb)
        for (HostTensor* in : c.inputs) opt.variant_inputs.push_back(in->view());
      if (dslopes) opt.variant_param_grads = {dslopes->view()};
      tj_test::run_launches(kernels::attention_backward_launches(p.q.view(), p.k.view(), p.v.view(), o.view(), p.dout.view(), lse.view(),
                                                                 dq.view(), dk.view(), dv.view(), opt, delta.view(), lse2.view(),
                                                                 std::nullopt, std::nullopt, std::nullopt, f8.views()));
      return std::array<HostTensor, 3>{dq, dk, dv};
    };
    const kernels::VariantBackward vb = kernels::attention_variant_backward(c.variant);
    HostTensor dslopes(DType::f32, {H});
    dslopes.fill_bytes(0xFF);
    const auto got = run(&vb, c.causal, vb.learnable ? &dslopes : nullptr);
    for (const HostTensor& t : got)
      for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(std::isfinite(t.at(i)));
    MESSAGE(what, " fp8 vs float64: dq ", rel_rmse(got[0], p.want.dq), " dk ", rel_rmse(got[1], p.want.dk), " dv ",
            rel_rmse(got[2], p.want.dv));
    CHECK(rel_rmse(got[0], p.want.dq) < 0.15);
    CHECK(rel_rmse(got[1], p.want.dk) < 0.15);
    CHECK(rel_rmse(got[2], p.want.dv) < 0.15);
    if (what == "causal as a hook") {
      const auto plain = run(nullptr, true, nullptr);
      for (int g = 0; g < 3; ++g) CHECK(std::memcmp(got[g].data(), plain[g].data(), got[g].size_bytes()) == 0);
    }
    if (vb.learnable) {
      // Against the 16-bit backward's slope gradient on the same inputs (the FP8 one's dS is e5m2 of 2^12 dS's f32).
      HostTensor d16(DType::f32, {H}), delta(DType::f32, rows), lse2(DType::f32, rows), dq(DType::f32, shape), dk(DType::f32, shape),
          dv(DType::f32, shape);
      kernels::AttentionBackwardOptions opt;
      opt.causal = true;
      opt.softmax_scale = scale_nat;
      opt.variant = &vb;
      opt.variant_inputs = {slope_t.view()};
      opt.variant_param_grads = {d16.view()};
      tj_test::run_launches(kernels::attention_backward_launches(p.q.view(), p.k.view(), p.v.view(), o.view(), p.dout.view(), lse.view(),
                                                                 dq.view(), dk.view(), dv.view(), opt, delta.view(), lse2.view(),
                                                                 std::nullopt));
      MESSAGE("learnable slopes' gradient, fp8 vs 16-bit backward: ", rel_rmse(dslopes, d16.values()));
      CHECK(rel_rmse(dslopes, d16.values()) < 0.15);
    }
  }
  // sm_90a: a window's FP8 kernels keep every dot on wgmma with e5m2 dS, no serialized wgmmas.
  const kernels::VariantBackward wb = kernels::attention_variant_backward(kernels::sliding_window_variant(1024));
  const int64_t Sb = 4096;
  const TensorSpec b8 = contiguous_spec(DType::e4m3, {2, 4, Sb, 128}), bt = contiguous_spec(DType::e4m3, {2, 4, 128, Sb}),
                   b32 = contiguous_spec(DType::f32, {2, 4, Sb}), bh = contiguous_spec(DType::f32, {2, 4}),
                   b16 = contiguous_spec(DType::bf16, {2, 4, Sb, 128});
  for (bool dkdv : {true, false}) {
    const ir::Function g = dkdv ? wb.dkdv_fp8.trace({b8, bt, b8, b8, b8, bt, b32, b32, bh, bh, bh, bh, b16, b16, RuntimeScalar{0.1f}, true})
                                : wb.dq_fp8.trace({b8, b8, bt, b8, b8, b32, b32, bh, bh, bh, bh, b16, RuntimeScalar{0.1f}, true});
    CAPTURE(g.name);
    const auto gen = codegen::generate_cuda(g, codegen::untuned_config(g, "sm_90a"), codegen::Target::parse("sm_90a"));
    CHECK(gen.lowering == "tensor cores (wgmma)");
    const auto r = tj_test::nvrtc(gen, "sm_90a", true, true);
    INFO(r.log);
    CHECK(r.ptx.find("e5m2.e4m3") != std::string::npos);
    CHECK(r.log.find("serialized") == std::string::npos);
    CHECK(tj_test::ptxas_info(r.log).spill_stores == 0);
  }
}

TEST_CASE("attention variant backward: learnable inputs' errors name the variant and the input") {
  kernels::AttentionVariant stray = kernels::learnable_alibi_variant(false);
  stray.name = "attention_test_stray";
  stray.learnable = {"bias"};
  CHECK_THROWS_WITH_AS(kernels::attention_variant_backward(stray),
                       doctest::Contains("'attention_test_stray': learnable input 'bias' is not one of its inputs"), Error);
  kernels::AttentionVariant no_grad = kernels::learnable_alibi_variant(false);
  no_grad.name = "attention_test_no_param_grad";
  no_grad.param_grad = {};
  CHECK_THROWS_WITH_AS(kernels::attention_variant_backward(no_grad),
                       doctest::Contains("'attention_test_no_param_grad' has learnable inputs without a param_grad"), Error);
  kernels::AttentionVariant wrong = kernels::learnable_alibi_variant(false);
  wrong.name = "attention_test_two_param_grads";
  wrong.param_grad = [](const Tile& s, const Tile&, const kernels::ScoreIndex&) { return std::vector<Tile>{s, s}; };
  const std::vector<int64_t> shape = {1, 2, 64, 32}, rows = {1, 2, 64};
  const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, rows}, heads{DType::f32, {2}};
  CHECK_THROWS_WITH_AS(kernels::attention_variant_backward(wrong).dkdv.trace({t16, t16, t16, t16, t32, t32, t16, t16,
                                                                               RuntimeScalar{0.1f}, false, heads, heads}),
                       doctest::Contains("param_grad returned 2 tile(s) for 1 learnable input(s)"), Error);

  HostTensor q(DType::bf16, shape), o(DType::bf16, shape), lse(DType::f32, rows), dq(DType::bf16, shape), delta(DType::f32, rows),
      lse2(DType::f32, rows), slopes(DType::f32, {2}), bad(DType::f32, {3});
  const kernels::VariantBackward vb = kernels::attention_variant_backward(kernels::learnable_alibi_variant(true));
  kernels::AttentionBackwardOptions opt;
  opt.variant = &vb;
  opt.variant_inputs = {slopes.view()};
  auto launches = [&] {
    return kernels::attention_backward_launches(q.view(), q.view(), q.view(), o.view(), o.view(), lse.view(), dq.view(), dq.view(),
                                                dq.view(), opt, delta.view(), lse2.view(), std::nullopt);
  };
  CHECK_THROWS_WITH_AS(launches(), doctest::Contains("'attention_alibi_learnable_causal': it has 1 learnable input(s), whose gradients "
                                                     "variant_param_grads must hold (f32 [2] each), got 0"),
                       Error);
  opt.variant_param_grads = {bad.view()};
  CHECK_THROWS_WITH_AS(launches(), doctest::Contains("a learnable input's gradient is f32[3]"), Error);
  opt.variant_param_grads = {slopes.view()};
  CHECK(launches().size() == 4);   // prepare, zero the gradient, dK / dV, dQ
  opt.variant = nullptr;
  opt.variant_inputs.clear();
  CHECK_THROWS_WITH_AS(launches(), doctest::Contains("parameter gradients given without a variant"), Error);
}

TEST_CASE("gpu: attention variant backward after the variant's forward with its LSE: float64 gradients of each variant's "
          "meaning") {
  TJ_REQUIRE_HOPPER();
  constexpr int64_t H = 2, S = 300, D = 128;
  const std::vector<int64_t> shape = {1, H, S, D}, rows = {1, H, S};
  const double scale_nat = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937 rng(29);
  for (Case& c : variant_cases(H, 2.0)) {
    // Every variant's hooks and both launch flags, without recompiling what the CPU test covers:
    // one softcap (the causal one only differs by its mask).
    if (std::string(c.what) == "softcap, causal in the mask only") continue;
    CAPTURE(c.what);
    const Problem p = make_problem(shape, scale_nat, c.meaning, rng);
    const Grads& want = p.want;
    const DeviceTensor dq_in = DeviceTensor::from_host(p.q), dk_in = DeviceTensor::from_host(p.k), dv_in = DeviceTensor::from_host(p.v),
                       ddo = DeviceTensor::from_host(p.dout);
    DeviceTensor o(DType::bf16, shape), lse(DType::f32, rows), gq(DType::f32, shape), gk(DType::bf16, shape), gv(DType::bf16, shape);
    std::vector<DeviceTensor> inputs;
    for (const HostTensor& in : c.inputs) inputs.push_back(DeviceTensor::from_host(in));
    std::vector<TensorView> views;
    for (const DeviceTensor& in : inputs) views.push_back(in.view());
    const Kernel forward = kernels::attention_variant(c.variant);
    kernels::AttentionFp8Options fwd;
    fwd.quantize = false;
    fwd.causal = c.causal;
    fwd.lse = lse.view();
    fwd.kernel = &forward;
    fwd.inputs = views;
    kernels::AttentionFp8Workspace fws;
    kernels::attention_fp8_forward(dq_in.view(), dk_in.view(), dv_in.view(), o.view(), fwd, fws);
    const kernels::VariantBackward vb = kernels::attention_variant_backward(c.variant);
    kernels::AttentionBackwardOptions opt;
    opt.causal = c.causal;
    opt.variant = &vb;
    opt.variant_inputs = views;
    kernels::AttentionBackwardWorkspace ws;
    for (DeviceTensor* t : {&gq, &gk, &gv}) t->fill_bytes(0xFF);   // NaN poison
    kernels::attention_backward(dq_in.view(), dk_in.view(), dv_in.view(), o.view(), ddo.view(), lse.view(), gq.view(), gk.view(),
                                gv.view(), opt, ws);
    const HostTensor hq = gq.to_host(), hk = gk.to_host(), hv = gv.to_host();
    MESSAGE(std::string(c.what), ": dq ", rel_rmse(hq, want.dq), " dk ", rel_rmse(hk, want.dk), " dv ", rel_rmse(hv, want.dv));
    CHECK(rel_rmse(hv, want.dv) < 2e-2);
    CHECK(rel_rmse(hk, want.dk) < 3e-2);
    CHECK(rel_rmse(hq, want.dq) < 2e-2);
  }
}

TEST_CASE("gpu: attention variant backward with learnable ALiBi slopes after its forward: gradients and the slopes' gradient "
          "against float64 (grouped-query heads)") {
  TJ_REQUIRE_HOPPER();
  constexpr int64_t H = 4, Hkv = 2, S = 300, D = 128;
  const std::vector<int64_t> shape = {1, H, S, D}, kv = {1, Hkv, S, D}, rows = {1, H, S};
  const double scale_nat = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937 rng(43);
  const LearnableProblem p = learnable_problem(H, Hkv, S, D, scale_nat, rng);
  const DeviceTensor q = DeviceTensor::from_host(p.q), k = DeviceTensor::from_host(p.k), v = DeviceTensor::from_host(p.v),
                     dout = DeviceTensor::from_host(p.dout), slopes = DeviceTensor::from_host(p.slopes);
  DeviceTensor o(DType::bf16, shape), lse(DType::f32, rows), gq(DType::f32, shape), gk(DType::f32, kv), gv(DType::f32, kv),
      dslopes(DType::f32, {H});
  const kernels::AttentionVariant variant = kernels::learnable_alibi_variant(true);
  const Kernel forward = kernels::attention_variant(variant);
  kernels::AttentionFp8Options fwd;
  fwd.quantize = false;
  fwd.causal = true;
  fwd.lse = lse.view();
  fwd.kernel = &forward;
  fwd.inputs = {slopes.view()};
  kernels::AttentionFp8Workspace fws;
  kernels::attention_fp8_forward(q.view(), k.view(), v.view(), o.view(), fwd, fws);
  const kernels::VariantBackward vb = kernels::attention_variant_backward(variant);
  kernels::AttentionBackwardOptions opt;
  opt.causal = true;
  opt.variant = &vb;
  opt.variant_inputs = {slopes.view()};
  opt.variant_param_grads = {dslopes.view()};
  kernels::AttentionBackwardWorkspace ws;
  for (DeviceTensor* t : {&gq, &gk, &gv, &dslopes}) t->fill_bytes(0xFF);   // NaN poison
  kernels::attention_backward(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), gq.view(), gk.view(), gv.view(), opt, ws);
  const HostTensor hq = gq.to_host(), hk = gk.to_host(), hv = gv.to_host(), hs = dslopes.to_host();
  MESSAGE("learnable ALiBi: dq ", rel_rmse(hq, p.want.dq), " dk ", rel_rmse(hk, p.want.dk), " dv ", rel_rmse(hv, p.want.dv),
          " dslopes ", rel_rmse(hs, p.dslopes), " (from the bf16 o: ", rel_rmse(hs, p.dslopes_bf16_o), ")");
  CHECK(rel_rmse(hv, p.want.dv) < 2e-2);
  CHECK(rel_rmse(hk, p.want.dk) < 3e-2);
  CHECK(rel_rmse(hq, p.want.dq) < 2e-2);
  // o here is the GPU forward's, not the float64 one rounded: against its own delta only loosely.
  CHECK(rel_rmse(hs, p.dslopes) < 8e-2);
}

TEST_CASE("gpu: attention variant backward FP8 after the variant's FP8 forward: float64 gradients within the FP8 recipe's "
          "error (a window, learnable ALiBi with its slopes)") {
  TJ_REQUIRE_HOPPER();
  constexpr int64_t H = 2, S = 300, D = 128;
  const std::vector<int64_t> shape = {1, H, S, D}, rows = {1, H, S};
  const double scale_nat = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937 rng(53);
  const std::vector<double> slopes = {0.02, -0.01};
  Meaning window;
  window.keep = [](int64_t i, int64_t j) { return j <= i && i - j < 48; };
  const HostTensor slope_h = HostTensor::from_values(slopes, DType::f32, {H});
  for (bool learnable : {false, true}) {
    const kernels::AttentionVariant variant = learnable ? kernels::learnable_alibi_variant(true) : kernels::sliding_window_variant(48);
    CAPTURE(variant.name);
    const Problem p = make_problem(shape, scale_nat, learnable ? learnable_alibi(slopes) : window, rng);
    const DeviceTensor q = DeviceTensor::from_host(p.q), k = DeviceTensor::from_host(p.k), v = DeviceTensor::from_host(p.v),
                       dout = DeviceTensor::from_host(p.dout), slope_d = DeviceTensor::from_host(slope_h);
    DeviceTensor o(DType::bf16, shape), lse(DType::f32, rows), gq(DType::f32, shape), gk(DType::f32, shape), gv(DType::f32, shape),
        dslopes(DType::f32, {H});
    std::vector<TensorView> inputs;
    if (learnable) inputs.push_back(slope_d.view());
    const Kernel forward = kernels::attention_variant(variant);
    kernels::AttentionFp8Options fwd;   // the FP8 forward from bf16 (its quantizers), with its LSE
    fwd.causal = true;
    fwd.lse = lse.view();
    fwd.kernel = &forward;
    fwd.inputs = inputs;
    kernels::AttentionFp8Workspace fws;
    kernels::attention_fp8_forward(q.view(), k.view(), v.view(), o.view(), fwd, fws);
    const kernels::VariantBackward vb = kernels::attention_variant_backward(variant);
    kernels::AttentionBackwardOptions opt;
    opt.fp8 = true;
    opt.causal = true;
    opt.variant = &vb;
    opt.variant_inputs = inputs;
    if (learnable) opt.variant_param_grads = {dslopes.view()};
    kernels::AttentionBackwardWorkspace ws;
    for (DeviceTensor* t : {&gq, &gk, &gv, &dslopes}) t->fill_bytes(0xFF);   // NaN poison
    kernels::attention_backward(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), gq.view(), gk.view(), gv.view(), opt, ws);
    const HostTensor hq = gq.to_host(), hk = gk.to_host(), hv = gv.to_host();
    MESSAGE(variant.name, " fp8: dq ", rel_rmse(hq, p.want.dq), " dk ", rel_rmse(hk, p.want.dk), " dv ", rel_rmse(hv, p.want.dv));
    CHECK(rel_rmse(hv, p.want.dv) < 0.15);
    CHECK(rel_rmse(hk, p.want.dk) < 0.15);
    CHECK(rel_rmse(hq, p.want.dq) < 0.15);
    if (learnable) {
      const HostTensor hs = dslopes.to_host();
      for (int64_t h = 0; h < H; ++h) CHECK(std::isfinite(hs.at(h)));
    }
  }
}
