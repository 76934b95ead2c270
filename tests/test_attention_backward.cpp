// The attention backward written in the DSL (kernels/attention_backward.h): its kernels on the CPU
// reference executor against float64 gradients, compiled by the generic tensor-core lowering for
// sm_90a (every dot on wgmma, without spills), and its host API (the launch list on the CPU
// reference, its errors, and on the GPU after attention_fp8_forward's LSE).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <regex>

#include "codegen/cuda_emitter.h"
#include "codegen/lowering.h"
#include "core/error.h"
#include "gpu.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "backward_testing.h"
#include "nvrtc_testing.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;
using tj_test::Grads;
using tj_test::random;
using tj_test::rel_rmse;
using tj_test::reference_attention;

namespace {

std::vector<ArgValue> values(std::vector<HostTensor*> tensors, std::vector<float> scalars) {
  std::vector<ArgValue> out;
  for (HostTensor* t : tensors) out.emplace_back(t->view());
  for (float s : scalars) out.emplace_back(s);
  return out;
}

}  // namespace

TEST_CASE("attention backward in the DSL: the CPU reference executor's gradients match float64 (causal and not)") {
  std::mt19937 rng(5);
  const std::vector<int64_t> shape = {1, 2, 96, 32};
  const double scale_nat = 1.0 / std::sqrt(32.0), scale = scale_nat / std::log(2.0);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    HostTensor q = random(DType::bf16, shape, rng), k = random(DType::bf16, shape, rng), v = random(DType::bf16, shape, rng),
               dout = random(DType::bf16, shape, rng);
    std::vector<double> o64, lse64;
    Grads want;
    reference_attention(q, k, v, dout, causal, scale_nat, o64, lse64, want);
    HostTensor o = HostTensor::from_values(o64, DType::bf16, shape);
    HostTensor lse = HostTensor::from_values(lse64, DType::f32, {shape[0], shape[1], shape[2]});
    HostTensor delta(DType::f32, {shape[0], shape[1], shape[2]}), dq(DType::bf16, shape), dk(DType::bf16, shape),
        dv(DType::bf16, shape);
    auto trace = [&](const Kernel& kk, std::vector<ArgSpec> specs) { return kk.trace(specs); };
    const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
    const ir::Function fd = trace(kernels::attention_bwd_delta(), {t16, t16, t32});
    run_reference(fd, default_config(fd), values({&o, &dout, &delta}, {}));
    const ir::Function fkv =
        trace(kernels::attention_bwd_dkdv(), {t16, t16, t16, t16, t32, t32, t16, t16, RuntimeScalar{0.0f}, causal});
    run_reference(fkv, default_config(fkv), values({&q, &k, &v, &dout, &lse, &delta, &dk, &dv}, {static_cast<float>(scale)}));
    const ir::Function fq = trace(kernels::attention_bwd_dq(), {t16, t16, t16, t16, t32, t32, t16, RuntimeScalar{0.0f}, causal});
    run_reference(fq, default_config(fq), values({&q, &k, &v, &dout, &lse, &delta, &dq}, {static_cast<float>(scale)}));
    CHECK(rel_rmse(dv, want.dv) < 2e-2);
    CHECK(rel_rmse(dk, want.dk) < 3e-2);
    CHECK(rel_rmse(dq, want.dq) < 3e-2);
    // The same gradients in one pass: dK / dV per key tile, dQ added into dq_acc by atomic adds
    // (from zero), then converted.
    HostTensor dk1(DType::bf16, shape), dv1(DType::bf16, shape), dq1(DType::bf16, shape);
    HostTensor dq_acc = HostTensor::from_values(std::vector<double>(q.numel(), 0.0), DType::f32, shape);
    const TensorSpec t32s{DType::f32, shape};
    const ir::Function ff =
        trace(kernels::attention_bwd_fused(), {t16, t16, t16, t16, t32, t32, t16, t16, t32s, RuntimeScalar{0.0f}, causal});
    run_reference(ff, default_config(ff), values({&q, &k, &v, &dout, &lse, &delta, &dk1, &dv1, &dq_acc}, {static_cast<float>(scale)}));
    const ir::Function fc = trace(kernels::attention_bwd_dq_convert(), {t32s, t16});
    run_reference(fc, default_config(fc), values({&dq_acc, &dq1}, {}));
    CHECK(rel_rmse(dv1, want.dv) < 2e-2);
    CHECK(rel_rmse(dk1, want.dk) < 3e-2);
    CHECK(rel_rmse(dq1, want.dq) < 3e-2);
  }
}

namespace {

// The FP8 backward's e4m3 operands (attention_bwd_*_fp8): q8, do8 [1, H, S, D], k8, v8 [1, Hkv, S,
// D], their descales [1, H] / [1, Hkv], the forward's lse (log2 units) and delta [1, H, S].
struct Fp8Operands {
  HostTensor q8, k8, v8, do8, sq, sk, sv, sdo, lse, delta;
};

// x [1, H, S, D] -> its transpose [1, H, D, S_pad] (S_pad: S rounded up to 16, zeros past S).
HostTensor transposed(const HostTensor& x) {
  const int64_t H = x.shape()[1], S = x.shape()[2], D = x.shape()[3], Sp = (S + 15) / 16 * 16;
  HostTensor t(x.dtype(), {1, H, D, Sp});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 0.0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t d = 0; d < D; ++d) t.set((h * D + d) * Sp + s, x.at((h * S + s) * D + d));
  return t;
}

// The recipe in float64: P8 = e4m3(2^8 P), dS8 = e5m2(2^12 dS), from the operands as given; dk and
// dv summed over each group of query heads.
Grads fp8_recipe_grads(const Fp8Operands& x, bool causal, double scale_nat) {
  const int64_t H = x.q8.shape()[1], Hkv = x.k8.shape()[1], S = x.q8.shape()[2], D = x.q8.shape()[3], G = H / Hkv;
  const double scale = scale_nat / std::log(2.0);
  Grads w{std::vector<double>(H * S * D, 0.0), std::vector<double>(Hkv * S * D, 0.0), std::vector<double>(Hkv * S * D, 0.0)};
  HostTensor p8(DType::e4m3, {1}), ds8(DType::e5m2, {1});
  for (int64_t h = 0; h < H; ++h) {
    const int64_t hk = h / G;
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < (causal ? i + 1 : S); ++j) {
        double s2 = 0, dp = 0;
        for (int64_t d = 0; d < D; ++d) {
          s2 += x.q8.at((h * S + i) * D + d) * x.k8.at((hk * S + j) * D + d);
          dp += x.do8.at((h * S + i) * D + d) * x.v8.at((hk * S + j) * D + d);
        }
        const double p = std::exp2(s2 * x.sq.at(h) * x.sk.at(hk) * scale - x.lse.at(h * S + i));
        dp *= x.sv.at(hk) * x.sdo.at(h);
        p8.set(0, p * 256.0);
        ds8.set(0, p * (dp - x.delta.at(h * S + i)) * 4096.0);
        for (int64_t d = 0; d < D; ++d) {
          w.dv[(hk * S + j) * D + d] += p8.at(0) * x.do8.at((h * S + i) * D + d) * x.sdo.at(h) / 256.0;
          w.dk[(hk * S + j) * D + d] += ds8.at(0) * x.q8.at((h * S + i) * D + d) * x.sq.at(h) * scale_nat / 4096.0;
          w.dq[(h * S + i) * D + d] += ds8.at(0) * x.k8.at((hk * S + j) * D + d) * x.sk.at(hk) * scale_nat / 4096.0;
        }
      }
  }
  return w;
}

}  // namespace

TEST_CASE("attention backward FP8 kernels (e4m3 Q K V dO, e5m2 dS): the reference executor matches a float64 emulation of "
          "the recipe, the gradients float64's to the recipe's error, wgmma for sm_90a") {
  std::mt19937 rng(41);
  const int64_t S = 96, D = 64, H = 2;
  const std::vector<int64_t> shape = {1, H, S, D}, rows = {1, H, S}, heads = {1, H};
  const double scale_nat = 1.0 / std::sqrt(static_cast<double>(D)), scale = scale_nat / std::log(2.0);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const HostTensor q = random(DType::bf16, shape, rng), k = random(DType::bf16, shape, rng), v = random(DType::bf16, shape, rng),
                     dout = random(DType::bf16, shape, rng);
    // Per-head e4m3 copies and descales (amax / 448 in f32), as the quantizers write them.
    auto quantize = [&](const HostTensor& x, HostTensor& x8, HostTensor& ds) {
      for (int64_t h = 0; h < H; ++h) {
        double amax = 0;
        for (int64_t i = 0; i < S * D; ++i) amax = std::max(amax, std::abs(x.at(h * S * D + i)));
        const float d = static_cast<float>(amax) * (1.0f / 448.0f), inv = 1.0f / d;
        ds.set(h, d);
        for (int64_t i = 0; i < S * D; ++i) x8.set(h * S * D + i, static_cast<float>(x.at(h * S * D + i)) * inv);
      }
    };
    Fp8Operands x{HostTensor(DType::e4m3, shape), HostTensor(DType::e4m3, shape), HostTensor(DType::e4m3, shape),
                  HostTensor(DType::e4m3, shape), HostTensor(DType::f32, heads),  HostTensor(DType::f32, heads),
                  HostTensor(DType::f32, heads),  HostTensor(DType::f32, heads),  HostTensor(DType::f32, rows),
                  HostTensor(DType::f32, rows)};
    quantize(q, x.q8, x.sq);
    quantize(k, x.k8, x.sk);
    quantize(v, x.v8, x.sv);
    quantize(dout, x.do8, x.sdo);
    // The FP8 forward's LSE (log2 units) and O over the quantized operands; delta from O and the
    // e4m3 dO (attention_bwd_prepare_fp8's, checked below).
    HostTensor o16(DType::bf16, shape);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> s2(S, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < (causal ? i + 1 : S); ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += x.q8.at((h * S + i) * D + d) * x.k8.at((h * S + j) * D + d);
          s2[j] = acc * x.sq.at(h) * x.sk.at(h) * scale;
          mx = std::max(mx, s2[j]);
        }
        double sum = 0;
        for (double e : s2) sum += std::isinf(e) ? 0.0 : std::exp2(e - mx);
        const double l = mx + std::log2(sum);
        x.lse.set(h * S + i, l);
        double dl = 0;
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j)
            acc += (std::isinf(s2[j]) ? 0.0 : std::exp2(s2[j] - l)) * x.v8.at((h * S + j) * D + d) * x.sv.at(h);
          o16.set((h * S + i) * D + d, acc);
          dl += o16.at((h * S + i) * D + d) * x.do8.at((h * S + i) * D + d) * x.sdo.at(h);
        }
        x.delta.set(h * S + i, dl);
      }
    {
      HostTensor lse_nat(DType::f32, rows), delta(DType::f32, rows), lse2(DType::f32, rows);
      for (int64_t i = 0; i < lse_nat.numel(); ++i) lse_nat.set(i, x.lse.at(i) * std::log(2.0));
      const ir::Function fp = kernels::attention_bwd_prepare_fp8().trace(
          {TensorSpec{DType::bf16, shape}, TensorSpec{DType::e4m3, shape}, TensorSpec{DType::f32, heads}, TensorSpec{DType::f32, rows},
           TensorSpec{DType::f32, rows}, TensorSpec{DType::f32, rows}});
      HostTensor do8 = x.do8, sdo = x.sdo;
      run_reference(fp, default_config(fp), values({&o16, &do8, &sdo, &lse_nat, &delta, &lse2}, {}));
      std::vector<double> want(S * H), want_lse(S * H);
      for (int64_t i = 0; i < S * H; ++i) want[i] = x.delta.at(i), want_lse[i] = x.lse.at(i);
      CHECK(rel_rmse(delta, want) < 1e-6);
      CHECK(rel_rmse(lse2, want_lse) < 1e-6);
    }
    const Grads w = fp8_recipe_grads(x, causal, scale_nat);
    // The kernels on the reference executor.
    HostTensor dq(DType::f32, shape), dk(DType::f32, shape), dv(DType::f32, shape);
    for (HostTensor* t : {&dq, &dk, &dv}) t->fill_bytes(0xFF);
    HostTensor qt8 = transposed(x.q8), dot8 = transposed(x.do8), kt8 = transposed(x.k8);
    const std::vector<int64_t> tshape = qt8.shape();
    const TensorSpec t8{DType::e4m3, shape}, tt{DType::e4m3, tshape}, t32{DType::f32, rows}, th{DType::f32, heads},
        to{DType::f32, shape};
    const ir::Function fkv = kernels::attention_bwd_dkdv_fp8().trace(
        {t8, tt, t8, t8, t8, tt, t32, t32, th, th, th, th, to, to, RuntimeScalar{0.0f}, causal});
    const ir::Function fq =
        kernels::attention_bwd_dq_fp8().trace({t8, t8, tt, t8, t8, t32, t32, th, th, th, th, to, RuntimeScalar{0.0f}, causal});
    Fp8Operands c = x;
    run_reference(fkv, default_config(fkv),
                  values({&c.q8, &qt8, &c.k8, &c.v8, &c.do8, &dot8, &c.lse, &c.delta, &c.sq, &c.sk, &c.sv, &c.sdo, &dk, &dv},
                         {static_cast<float>(scale)}));
    run_reference(fq, default_config(fq),
                  values({&c.q8, &c.k8, &kt8, &c.v8, &c.do8, &c.lse, &c.delta, &c.sq, &c.sk, &c.sv, &c.sdo, &dq},
                         {static_cast<float>(scale)}));
    // Against the emulation (3e-8 here; the bound leaves room for the executor's f32 rounding a
    // P8 or dS8 the other way) ...
    CHECK(rel_rmse(dv, w.dv) < 1e-3);
    CHECK(rel_rmse(dk, w.dk) < 1e-3);
    CHECK(rel_rmse(dq, w.dq) < 1e-3);
    // ... and against float64 of the 16-bit inputs: the recipe's own error (5-8e-2 at S 1024 in
    // bench/attention/backward_emulation.py).
    std::vector<double> o64, lse64;
    Grads exact;
    reference_attention(q, k, v, dout, causal, scale_nat, o64, lse64, exact);
    MESSAGE("FP8 backward on the reference executor vs float64: dq ", rel_rmse(dq, exact.dq), " dk ", rel_rmse(dk, exact.dk), " dv ",
            rel_rmse(dv, exact.dv), " (vs the recipe's emulation: dq ", rel_rmse(dq, w.dq), " dk ", rel_rmse(dk, w.dk), " dv ",
            rel_rmse(dv, w.dv), ")");
    CHECK(rel_rmse(dv, exact.dv) < 0.15);
    CHECK(rel_rmse(dk, exact.dk) < 0.15);
    CHECK(rel_rmse(dq, exact.dq) < 0.15);
    // Every dot on wgmma for sm_90a (untuned configs) with every operand read by TMA (K-major
    // copies: no transposition through registers), ptxas without serialized wgmmas.
    const int64_t Sb = 1024;
    const TensorSpec b8 = contiguous_spec(DType::e4m3, {2, 4, Sb, 128}), bt = contiguous_spec(DType::e4m3, {2, 4, 128, Sb}),
                     b32 = contiguous_spec(DType::f32, {2, 4, Sb}), bh = contiguous_spec(DType::f32, {2, 4}),
                     b16 = contiguous_spec(DType::bf16, {2, 4, Sb, 128});
    for (bool dkdv : {true, false}) {
      const ir::Function g =
          dkdv ? kernels::attention_bwd_dkdv_fp8().trace(
                     {b8, bt, b8, b8, b8, bt, b32, b32, bh, bh, bh, bh, b16, b16, RuntimeScalar{0.1f}, causal})
               : kernels::attention_bwd_dq_fp8().trace({b8, b8, bt, b8, b8, b32, b32, bh, bh, bh, bh, b16, RuntimeScalar{0.1f}, causal});
      CAPTURE(g.name);
      const auto gen = codegen::generate_cuda(g, codegen::untuned_config(g, "sm_90a"), codegen::Target::parse("sm_90a"));
      CHECK(gen.lowering == "tensor cores (wgmma)");
      const auto r = tj_test::nvrtc(gen, "sm_90a", true, true);
      INFO(r.log);
      CHECK(r.ptx.find("e5m2.e4m3") != std::string::npos);   // dS (e5m2) times Q or K (e4m3)
      CHECK(r.log.find("serialized") == std::string::npos);
    }
  }
}

TEST_CASE("attention backward in the DSL: every dot on wgmma for sm_90a and on mma.sync for sm_80, without spills or serialized wgmmas") {
  const std::vector<int64_t> shape = {2, 4, 1024, 128};
  const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
  for (const char* arch : {"sm_90a", "sm_80"})
  for (bool causal : {false, true}) {
    for (const Kernel* k : {&kernels::attention_bwd_dkdv(), &kernels::attention_bwd_dq(), &kernels::attention_bwd_fused()}) {
      const bool dkdv = k != &kernels::attention_bwd_dq(), fused = k == &kernels::attention_bwd_fused();
      std::vector<ArgSpec> specs = {t16, t16, t16, t16, t32, t32, t16};
      if (dkdv) specs.push_back(t16);
      if (fused) specs.push_back(contiguous_spec(DType::f32, shape));   // as launch() specs it: rows of unit stride
      specs.push_back(RuntimeScalar{0.1f});
      specs.push_back(causal);
      const ir::Function f = k->trace(specs);
      const bool wg = std::string(arch) == "sm_90a";
      const Config c = codegen::untuned_config(f, arch);
      CAPTURE(std::string(arch));
      CAPTURE(f.name);
      CAPTURE(causal);
      CAPTURE(c.to_json());
      const auto g = codegen::generate_cuda(f, c, codegen::Target::parse(arch));
      INFO(g.source);
      CHECK(g.lowering == (wg ? "tensor cores (wgmma)" : "tensor cores (mma.sync)"));
      CHECK(g.notes.empty());
      const auto r = tj_test::nvrtc(g, arch, true, true);
      CHECK(std::regex_search(r.ptx, std::regex(wg ? R"(wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16)"
                                                   : R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32)")));
      INFO(r.log);
      // The fused kernel holds dK, dV and dQ^T's accumulators at once: a few words spill (causal,
      // whose query tiles are all whole since the emitter's divisor analysis: 48 bytes on sm_90a,
      // 96-116 on sm_80, whose key tiles walk from the first, the longest, since program_trips).
      CHECK(tj_test::ptxas_info(r.log).spill_stores <= (fused ? (wg ? 64 : 128) : 0));
      CHECK(r.log.find("serialized") == std::string::npos);   // ptxas kept the wgmmas asynchronous (no C751x)
      // dQ^T's atomic adds: 16-byte vector reductions through shared memory where the target has
      // them (sm_90 on), element by element otherwise or with knob stage_stores 3.
      if (fused) {
        CHECK((r.ptx.find("red.global.add.v4.f32") != std::string::npos) == wg);
        Config element_adds = c;
        element_adds.knobs["stage_stores"] = 3;
        const std::string src = codegen::generate_cuda(f, element_adds, codegen::Target::parse(arch)).source;
        CHECK(src.find("store_add_staged") == std::string::npos);
        CHECK(src.find("store_add<") != std::string::npos);
      }
    }
  }
}

TEST_CASE("attention backward in the DSL: grouped-query heads and Sq != Skv keep every dot on wgmma, and the group sum compiles") {
  const TensorSpec q{DType::bf16, {2, 8, 1024, 128}}, kv{DType::bf16, {2, 2, 768, 128}}, rows{DType::f32, {2, 8, 1024}},
      part{DType::f32, {2, 8, 768, 128}};
  for (bool causal : {false, true})
    for (const Kernel* k : {&kernels::attention_bwd_dkdv(), &kernels::attention_bwd_dq(), &kernels::attention_bwd_fused()}) {
      const bool dkdv = k != &kernels::attention_bwd_dq(), fused = k == &kernels::attention_bwd_fused();
      std::vector<ArgSpec> specs = {q, kv, kv, q, rows, rows};
      if (dkdv) {
        specs.push_back(part);
        specs.push_back(part);
      } else {
        specs.push_back(q);
      }
      if (fused) specs.push_back(TensorSpec{DType::f32, q.shape});
      specs.push_back(RuntimeScalar{0.1f});
      specs.push_back(causal);
      const ir::Function f = k->trace(specs);
      CAPTURE(f.name);
      CAPTURE(causal);
      const auto g = codegen::generate_cuda(f, codegen::untuned_config(f, "sm_90a"), codegen::Target::parse("sm_90a"));
      CHECK(g.lowering == "tensor cores (wgmma)");
      CHECK(g.notes.empty());
      const auto r = tj_test::nvrtc(g, "sm_90a", true, true);
      CHECK(std::regex_search(r.ptx, std::regex(R"(wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16)")));
    }
  const ir::Function f = kernels::attention_bwd_group_sum().trace({part, TensorSpec{DType::bf16, {2, 2, 768, 128}}});
  const auto g = codegen::generate_cuda(f, codegen::untuned_config(f, "sm_90a"), codegen::Target::parse("sm_90a"));
  INFO(g.source);
  CHECK(tj_test::nvrtc(g, "sm_90a", true, true).ptx.find("ld.global") != std::string::npos);
}

namespace {

// Random bf16 inputs and their float64 forward (o, the LSE in log2 units) and gradients.
struct Problem {
  HostTensor q, k, v, dout;
  std::vector<double> o, lse2;
  Grads want;
};

// q and dout of `shape`, k and v of `kv_shape` (default: `shape`).
Problem make_problem(const std::vector<int64_t>& shape, bool causal, double scale_nat, std::mt19937& rng,
                     std::vector<int64_t> kv_shape = {}) {
  if (kv_shape.empty()) kv_shape = shape;
  Problem p{random(DType::bf16, shape, rng), random(DType::bf16, kv_shape, rng), random(DType::bf16, kv_shape, rng),
            random(DType::bf16, shape, rng), {}, {}, {}};
  reference_attention(p.q, p.k, p.v, p.dout, causal, scale_nat, p.o, p.lse2, p.want);
  return p;
}

// On the GPU: attention_fp8_forward with its LSE (fp8: quantizing, else on the 16-bit inputs as
// given), then attention_backward (fp8 or not) for p's dout; the gradients in `grad`, the
// backward's workspace kept (its FP8 copies).
struct GpuBackward {
  DeviceTensor gq, gk, gv;
  kernels::AttentionBackwardWorkspace ws;
};
void gpu_backward(const Problem& p, bool causal, bool fp8, bool deterministic, GpuBackward& out) {
  const std::vector<int64_t>& shape = p.q.shape();
  const DeviceTensor q = DeviceTensor::from_host(p.q), k = DeviceTensor::from_host(p.k), v = DeviceTensor::from_host(p.v),
                     dout = DeviceTensor::from_host(p.dout);
  DeviceTensor o(DType::bf16, shape), lse(DType::f32, {shape[0], shape[1], shape[2]});
  for (DeviceTensor* t : {&out.gq, &out.gk, &out.gv}) t->fill_bytes(0xFF);
  kernels::AttentionFp8Options fwd;
  fwd.quantize = fp8;
  fwd.causal = causal;
  fwd.lse = lse.view();
  kernels::AttentionFp8Workspace fws;
  kernels::attention_fp8_forward(q.view(), k.view(), v.view(), o.view(), fwd, fws);
  kernels::AttentionBackwardOptions opt;
  opt.causal = causal;
  opt.deterministic = deterministic;
  opt.fp8 = fp8;
  kernels::attention_backward(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), out.gq.view(), out.gk.view(),
                              out.gv.view(), opt, out.ws);
}

std::string backward_error(const TensorView& q, const TensorView& k, const TensorView& lse, const TensorView& dq) {
  try {
    kernels::attention_backward_launches(q, k, k, q, q, lse, dq, k, k, {}, lse, lse, std::nullopt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("attention_backward's launches on the CPU reference: from the forward's natural-log LSE to float64 gradients, "
          "deterministic and fused") {
  std::mt19937 rng(15);
  const std::vector<int64_t> shape = {1, 2, 80, 32}, rows = {1, 2, 80};
  const double scale_nat = 0.2;   // not 1/sqrt(D): the option reaches every kernel
  for (bool causal : {false, true})
    for (bool deterministic : {true, false}) {
      CAPTURE(causal);
      CAPTURE(deterministic);
      Problem p = make_problem(shape, causal, scale_nat, rng);
      HostTensor &q = p.q, &k = p.k, &v = p.v, &dout = p.dout;
      const std::vector<double>&o64 = p.o, &lse2_64 = p.lse2;
      const Grads& want = p.want;
      std::vector<double> lse_nat(lse2_64.size());
      for (size_t i = 0; i < lse_nat.size(); ++i) lse_nat[i] = lse2_64[i] * std::log(2.0);
      HostTensor o = HostTensor::from_values(o64, DType::bf16, shape), lse = HostTensor::from_values(lse_nat, DType::f32, rows);
      HostTensor delta(DType::f32, rows), lse2(DType::f32, rows), dq(DType::f32, shape), dk(DType::bf16, shape),
          dv(DType::bf16, shape);
      HostTensor dq_acc = HostTensor::from_values(std::vector<double>(q.numel(), 0.0), DType::f32, shape);
      for (HostTensor* t : {&delta, &lse2, &dq, &dk, &dv}) t->fill_bytes(0xFF);
      kernels::AttentionBackwardOptions opt;
      opt.causal = causal;
      opt.softmax_scale = scale_nat;
      opt.deterministic = deterministic;
      tj_test::run_launches(kernels::attention_backward_launches(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), dq.view(),
                                                        dk.view(), dv.view(), opt, delta.view(), lse2.view(),
                                                        deterministic ? std::nullopt : std::optional<TensorView>(dq_acc.view())));
      for (int64_t i = 0; i < lse2.numel(); ++i) CHECK(lse2.at(i) == doctest::Approx(lse2_64[i]).epsilon(1e-5));
      CHECK(rel_rmse(dv, want.dv) < 2e-2);
      CHECK(rel_rmse(dk, want.dk) < 3e-2);
      CHECK(rel_rmse(dq, want.dq) < 2e-2);   // f32 dq: only the bf16 inputs and P's rounding
    }
}

TEST_CASE("attention_backward's launches on the CPU reference: grouped-query heads and different query and key lengths "
          "match float64") {
  std::mt19937 rng(25);
  const double scale_nat = 1.0 / std::sqrt(32.0);
  struct Case {
    int64_t H, Hkv, Sq, Skv;
  };
  for (const Case& c : {Case{4, 2, 80, 80}, Case{4, 1, 64, 64}, Case{2, 2, 80, 112}, Case{4, 2, 112, 72}})
    for (bool causal : {false, true})
      for (bool deterministic : {true, false}) {
        INFO("H " << c.H << " Hkv " << c.Hkv << " Sq " << c.Sq << " Skv " << c.Skv << " causal " << causal << " deterministic "
                  << deterministic);
        const std::vector<int64_t> shape = {1, c.H, c.Sq, 32}, kv = {1, c.Hkv, c.Skv, 32}, rows = {1, c.H, c.Sq},
                                   part = {1, c.H, c.Skv, 32};
        Problem p = make_problem(shape, causal, scale_nat, rng, kv);
        std::vector<double> lse_nat(p.lse2.size());
        for (size_t i = 0; i < lse_nat.size(); ++i) lse_nat[i] = p.lse2[i] * std::log(2.0);
        HostTensor o = HostTensor::from_values(p.o, DType::bf16, shape), lse = HostTensor::from_values(lse_nat, DType::f32, rows);
        HostTensor delta(DType::f32, rows), lse2(DType::f32, rows), dq(DType::f32, shape), dk(DType::f32, kv), dv(DType::bf16, kv),
            dk_part(DType::f32, part), dv_part(DType::f32, part);
        HostTensor dq_acc = HostTensor::from_values(std::vector<double>(p.q.numel(), 0.0), DType::f32, shape);
        for (HostTensor* t : {&delta, &lse2, &dq, &dk, &dv, &dk_part, &dv_part}) t->fill_bytes(0xFF);
        kernels::AttentionBackwardOptions opt;
        opt.causal = causal;
        opt.deterministic = deterministic;
        const bool grouped = c.H != c.Hkv;
        tj_test::run_launches(kernels::attention_backward_launches(
            p.q.view(), p.k.view(), p.v.view(), o.view(), p.dout.view(), lse.view(), dq.view(), dk.view(), dv.view(), opt,
            delta.view(), lse2.view(), deterministic ? std::nullopt : std::optional<TensorView>(dq_acc.view()),
            grouped ? std::optional<TensorView>(dk_part.view()) : std::nullopt,
            grouped ? std::optional<TensorView>(dv_part.view()) : std::nullopt));
        CHECK(rel_rmse(dv, p.want.dv) < 2e-2);
        CHECK(rel_rmse(dk, p.want.dk) < 2e-2);
        CHECK(rel_rmse(dq, p.want.dq) < 2e-2);
      }
}

TEST_CASE("attention_backward: inputs that do not fit are errors naming the tensor") {
  auto view = [](DType dt, std::vector<int64_t> shape) {
    TensorView v;
    v.dtype = dt;
    v.shape = std::move(shape);
    v.device = Device::cuda;
    return v;
  };
  const TensorView q = view(DType::bf16, {1, 8, 256, 64}), lse = view(DType::f32, {1, 8, 256});
  CHECK(backward_error(q, q, lse, q) == "");
  CHECK(backward_error(q, view(DType::bf16, {1, 8, 128, 64}), lse, q) == "");   // fewer keys than queries
  CHECK(backward_error(q, view(DType::bf16, {1, 2, 256, 64}), lse, q) ==
        "attention backward: grouped-query heads (4 query heads per kv head) need the dk_part scratch, f32[1, 8, 256, 64]");
  CHECK(backward_error(q, view(DType::bf16, {1, 3, 256, 64}), lse, q) ==
        "attention backward: k is bf16[1, 3, 256, 64] (cuda): expected [B, Hkv, Skv, D] with q's B and D and Hkv dividing q's 8 "
        "heads (q is bf16[1, 8, 256, 64] (cuda))");
  CHECK(backward_error(q, view(DType::bf16, {1, 8, 256, 32}), lse, q) ==
        "attention backward: k is bf16[1, 8, 256, 32] (cuda): expected [B, Hkv, Skv, D] with q's B and D and Hkv dividing q's 8 "
        "heads (q is bf16[1, 8, 256, 64] (cuda))");
  CHECK(backward_error(q, q, lse, view(DType::bf16, {1, 8, 255, 64})) ==
        "attention backward: dq is bf16[1, 8, 255, 64] (cuda): expected the shape of q, bf16[1, 8, 256, 64] (cuda)");
  const TensorView kv2 = view(DType::bf16, {1, 2, 256, 64}), wrong_part = view(DType::f32, {1, 2, 256, 64});
  CHECK_THROWS_WITH_AS(kernels::attention_backward_launches(q, kv2, kv2, q, q, lse, q, kv2, kv2, {}, lse, lse, std::nullopt, wrong_part,
                                                            wrong_part),
                       "attention backward: grouped-query heads (4 query heads per kv head) need the dk_part scratch, f32[1, 8, "
                       "256, 64], got f32[1, 2, 256, 64] (cuda)",
                       Error);
  CHECK(backward_error(q, view(DType::f16, {1, 8, 256, 64}), lse, q) ==
        "attention backward: k is f16[1, 8, 256, 64] (cuda): expected q's dtype, bf16");
  CHECK(backward_error(q, q, lse, view(DType::e4m3, {1, 8, 256, 64})) ==
        "attention backward: dq is e4m3[1, 8, 256, 64] (cuda): expected f32, bf16 or f16");
  CHECK(backward_error(q, q, view(DType::f32, {1, 8, 255}), q) ==
        "attention backward: lse is f32[1, 8, 255] (cuda): expected f32[1, 8, 256] (the forward's)");
  CHECK(backward_error(view(DType::f32, {1, 8, 256, 64}), view(DType::f32, {1, 8, 256, 64}), lse, q) ==
        "attention backward: q is f32[1, 8, 256, 64] (cuda): expected bf16 or f16");
  kernels::AttentionBackwardOptions fused;
  fused.deterministic = false;
  CHECK_THROWS_WITH_AS(kernels::attention_backward_launches(q, q, q, q, q, lse, q, q, q, fused, lse, lse, std::nullopt),
                       "attention backward: the fused pass needs its dq_acc scratch", Error);
  kernels::AttentionBackwardOptions fp8;
  fp8.fp8 = true;
  CHECK_THROWS_WITH_AS(kernels::attention_backward_launches(q, q, q, q, q, lse, q, q, q, fp8, lse, lse, std::nullopt),
                       "attention backward: fp8 needs the e4m3 operands (BackwardFp8Views)", Error);
  const kernels::BackwardFp8Views f8{q, q, q, q, q, q, q, lse, lse, lse, lse};
  CHECK_THROWS_WITH_AS(kernels::attention_backward_launches(q, q, q, q, q, lse, q, q, q, kernels::AttentionBackwardOptions{}, lse,
                                                            lse, std::nullopt, std::nullopt, std::nullopt, f8),
                       "attention backward: e4m3 operands given without opt.fp8", Error);
  fp8.deterministic = false;
  CHECK_THROWS_WITH_AS(kernels::attention_backward_launches(q, q, q, q, q, lse, q, q, q, fp8, lse, lse, q, std::nullopt, std::nullopt, f8),
                       "attention backward: the FP8 backward runs as three kernels only: set deterministic (no fused pass yet)",
                       Error);
}

TEST_CASE("gpu: attention_backward after attention_fp8_forward's LSE: float64 gradients (bf16, causal and not, both paths, "
          "grouped-query heads, Sq != Skv)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(16);
  const double scale_nat = 1.0 / std::sqrt(128.0);
  struct Case {
    int64_t H, Hkv, Sq, Skv;
  };
  for (const Case& c : {Case{2, 2, 384, 384}, Case{4, 2, 384, 384}, Case{2, 2, 320, 448}})
  for (bool causal : {false, true})
    for (bool deterministic : {true, false}) {
      INFO("H " << c.H << " Hkv " << c.Hkv << " Sq " << c.Sq << " Skv " << c.Skv << " causal " << causal << " deterministic "
                << deterministic);
      const std::vector<int64_t> shape = {1, c.H, c.Sq, 128}, kv = {1, c.Hkv, c.Skv, 128};
      const Problem p = make_problem(shape, causal, scale_nat, rng, kv);
      const Grads& want = p.want;
      GpuBackward r{DeviceTensor(DType::bf16, shape), DeviceTensor(DType::bf16, kv), DeviceTensor(DType::bf16, kv), {}};
      gpu_backward(p, causal, /*fp8=*/false, deterministic, r);
      const DeviceTensor &gq = r.gq, &gk = r.gk, &gv = r.gv;
      const HostTensor hq = gq.to_host(), hk = gk.to_host(), hv = gv.to_host();
      MESSAGE("dq ", rel_rmse(hq, want.dq), " dk ", rel_rmse(hk, want.dk), " dv ", rel_rmse(hv, want.dv));
      CHECK(rel_rmse(hv, want.dv) < 2e-2);
      CHECK(rel_rmse(hk, want.dk) < 3e-2);
      CHECK(rel_rmse(hq, want.dq) < 3e-2);
    }
}

TEST_CASE("gpu: attention_backward fp8 after the FP8 forward: the recipe's float64 emulation of the device's operands, float64 "
          "within 2x the recipe's error, finite on outliers (causal and not, grouped-query heads)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(23);
  const double scale_nat = 1.0 / std::sqrt(128.0);
  auto rmse = [](const std::vector<double>& got, const std::vector<double>& want) {
    double e = 0, r = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      e += (got[i] - want[i]) * (got[i] - want[i]);
      r += want[i] * want[i];
    }
    return std::sqrt(e / std::max(r, 1e-300));
  };
  auto doubles = [](const HostTensor& t) {
    std::vector<double> out(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = t.at(i);
    return out;
  };
  struct Case {
    int64_t H, Hkv;
    bool outliers;
  };
  for (const Case& c : {Case{2, 2, false}, Case{4, 2, false}, Case{2, 2, true}})
    for (bool causal : {false, true}) {
      const int64_t S = 384;
      INFO("H " << c.H << " Hkv " << c.Hkv << " outliers " << c.outliers << " causal " << causal);
      const std::vector<int64_t> shape = {1, c.H, S, 128}, kv = {1, c.Hkv, S, 128};
      Problem p = make_problem(shape, causal, scale_nat, rng, kv);
      if (c.outliers) {   // N(0, 1) + N(0, 100) * Bernoulli(0.001) (variance 100), the issue's outlier inputs
        std::bernoulli_distribution hit(0.001);
        std::normal_distribution<double> big(0, 10);
        for (HostTensor* t : {&p.q, &p.k, &p.v})
          for (int64_t i = 0; i < t->numel(); ++i)
            if (hit(rng)) t->set(i, t->at(i) + big(rng));
        std::vector<double> o64, lse64;
        reference_attention(p.q, p.k, p.v, p.dout, causal, scale_nat, o64, lse64, p.want);
      }
      GpuBackward r{DeviceTensor(DType::f32, shape), DeviceTensor(DType::f32, kv), DeviceTensor(DType::f32, kv), {}};
      gpu_backward(p, causal, /*fp8=*/true, /*deterministic=*/true, r);
      const DeviceTensor &gq = r.gq, &gk = r.gk, &gv = r.gv;
      const kernels::AttentionBackwardWorkspace& ws = r.ws;
      const Grads got{doubles(gq.to_host()), doubles(gk.to_host()), doubles(gv.to_host())};
      const Fp8Operands x{ws.q8->to_host(), ws.k8->to_host(),  ws.v8->to_host(),  ws.do8->to_host(),  ws.sq->to_host(),
                          ws.sk->to_host(), ws.sv->to_host(),  ws.sdo->to_host(), ws.lse2->to_host(), ws.delta->to_host()};
      // The FP8 forward's LSE (log2 units) against float64's over the same e4m3 operands.
      double lse_err = 0;
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t hk = h / (c.H / c.Hkv);
          std::vector<double> s2;
          for (int64_t j = 0; j < (causal ? i + 1 : S); ++j) {
            double acc = 0;
            for (int64_t d = 0; d < 128; ++d) acc += x.q8.at((h * S + i) * 128 + d) * x.k8.at((hk * S + j) * 128 + d);
            s2.push_back(acc * x.sq.at(h) * x.sk.at(hk) * scale_nat / std::log(2.0));
          }
          const double mx = *std::max_element(s2.begin(), s2.end());
          double sum = 0;
          for (double e : s2) sum += std::exp2(e - mx);
          lse_err = std::max(lse_err, std::abs(mx + std::log2(sum) - x.lse.at(h * S + i)));
        }
      MESSAGE("the FP8 forward's LSE: max |error| ", lse_err, " (log2 units)");
      CHECK(lse_err < 1e-2);
      const Grads w = fp8_recipe_grads(x, causal, scale_nat);
      // The transposed copies are the copies' transposes.
      CHECK(doubles(ws.qt8->to_host()) == doubles(transposed(x.q8)));
      CHECK(doubles(ws.kt8->to_host()) == doubles(transposed(x.k8)));
      CHECK(doubles(ws.dot8->to_host()) == doubles(transposed(x.do8)));
      for (const auto* g : {&got.dq, &got.dk, &got.dv})
        for (double e : *g) REQUIRE(std::isfinite(e));
      MESSAGE("vs the emulation: dq ", rmse(got.dq, w.dq), " dk ", rmse(got.dk, w.dk), " dv ", rmse(got.dv, w.dv), "; vs float64: dq ",
              rmse(got.dq, p.want.dq), " dk ", rmse(got.dk, p.want.dk), " dv ", rmse(got.dv, p.want.dv), " (emulation ",
              rmse(w.dq, p.want.dq), " ", rmse(w.dk, p.want.dk), " ", rmse(w.dv, p.want.dv), ")");
      // The device against the emulation of its own operands: f32 accumulation order and the P8 /
      // dS8 roundings it flips.
      CHECK(rmse(got.dv, w.dv) < 2e-2);
      CHECK(rmse(got.dk, w.dk) < 2e-2);
      CHECK(rmse(got.dq, w.dq) < 2e-2);
      // The issue's bar: within 2x the recipe's own error against float64.
      CHECK(rmse(got.dv, p.want.dv) <= 2 * rmse(w.dv, p.want.dv));
      CHECK(rmse(got.dk, p.want.dk) <= 2 * rmse(w.dk, p.want.dk));
      CHECK(rmse(got.dq, p.want.dq) <= 2 * rmse(w.dq, p.want.dq));
    }
}
