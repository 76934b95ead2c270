// Attention variants (kernels/attention_variant.h, kernels/attention_variants.h): hooks traced
// under IR tags, recognized and inlined by the sm_90a lowering (codegen/attention_hooks.*).
//
// CPU (CI): each variant on the CPU reference executor against a float64 attention with the
// variant's own mask / score function, bf16 and e4m3 (GQA, tails, Sq != Skv); recognition and
// NVRTC compilation of every variant for sm_90a (wgmma in the PTX, hooks in the source);
// error messages for malformed hooks; hooks the lowering cannot inline take the SIMT path.
// GPU (TJ_REQUIRE_GPU): every variant lowered on the GPU against the CPU reference executor
// running the same IR, with block skipping on and off; a block mask and segments over more key
// blocks than the kernel's block table against float64.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <random>

#include "attention_accuracy.h"
#include "autotune/space.h"
#include "codegen/lower_attention_sm90.h"
#include "gpu.h"
#include "nvrtc_testing.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variants.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"

using namespace tj;
using namespace tj_test;

namespace {

// The float64 meaning of a variant: score(s, b, h, i, j) on the scaled score, keep(b, h, i, j).
struct VariantMeaning {
  std::function<double(double, int64_t, int64_t, int64_t, int64_t)> score = [](double s, int64_t, int64_t, int64_t,
                                                                               int64_t) { return s; };
  std::function<bool(int64_t, int64_t, int64_t, int64_t)> keep = [](int64_t, int64_t, int64_t, int64_t) { return true; };
};

struct NamedVariant {
  kernels::AttentionVariant variant;
  VariantMeaning meaning;
  std::function<HostTensor(int64_t B)> input = {};   // the variant's extra input, if it takes one
};

// prefix lengths used with the prefix-LM variant: batch b has prefix 37 + 50 b
int64_t prefix_of(int64_t b) { return 37 + 50 * b; }

HostTensor prefix_tensor(int64_t B);
// Packed documents: cu_seqlens of 4 documents (one of length 1); positions past the last
// boundary belong to the last document.
const std::vector<int64_t> kCuSeqlens = {0, 37, 100, 101, 250};
int64_t document_of(int64_t i) {
  int64_t d = 0;
  for (size_t b = 1; b + 1 < kCuSeqlens.size(); ++b) d += i >= kCuSeqlens[b];
  return d;
}
HostTensor cu_seqlens_tensor(int64_t) {
  HostTensor t(DType::i32, {static_cast<int64_t>(kCuSeqlens.size())});
  for (size_t i = 0; i < kCuSeqlens.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(kCuSeqlens[i]));
  return t;
}

// The block mask of the block-mask variant: 32 x 32 cells, [1, 4, 40, 40] (one pattern for every
// batch entry; positions past 40 * 32 are masked), a pseudo-random pattern that keeps the
// diagonal so that few rows go empty.
constexpr int64_t kCell = 32, kCells = 40, kMaskHeads = 4;
bool cell_kept(int64_t h, int64_t qi, int64_t kj) {
  if (qi >= kCells || kj >= kCells) return false;
  return qi == kj || (h * 7 + qi * 13 + kj * 29) % 5 > 1;
}
HostTensor block_mask_tensor(int64_t) {
  HostTensor t(DType::i32, {1, kMaskHeads, kCells, kCells});
  for (int64_t h = 0; h < kMaskHeads; ++h)
    for (int64_t i = 0; i < kCells; ++i)
      for (int64_t j = 0; j < kCells; ++j) t.set((h * kCells + i) * kCells + j, cell_kept(h, i, j) ? 1.0 : 0.0);
  return t;
}

std::vector<NamedVariant> variants(int64_t heads) {
  std::vector<NamedVariant> out;
  auto causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; };
  out.push_back({kernels::causal_variant(), {.keep = causal}});
  out.push_back({kernels::sliding_window_variant(48),
                 {.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i && i - j < 48; }}});
  out.push_back({kernels::alibi_variant(heads, true),
                 {.score =
                      [heads](double s, int64_t, int64_t h, int64_t i, int64_t j) {
                        return s + std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(heads)) *
                                       static_cast<double>(j - i);
                      },
                  .keep = causal}});
  // ALiBi with learnable slopes: an f32 [H] input read per head (a field of the CTA on sm_90a).
  auto learned = [](int64_t h) { return 0.04 * static_cast<double>(h + 1) - 0.07; };
  out.push_back({kernels::learnable_alibi_variant(true),
                 {.score = [learned](double s, int64_t, int64_t h, int64_t i, int64_t j) { return s + learned(h) * static_cast<double>(j - i); },
                  .keep = causal},
                 [heads, learned](int64_t) {
                   HostTensor t(DType::f32, {heads});
                   for (int64_t h = 0; h < heads; ++h) t.set(h, learned(h));
                   return t;
                 }});
  // A score hook linear in the score and the positions, with every coefficient (a factor on the
  // score, per-head key term, a query term that does not cancel it, a constant): the sm_90a
  // lowering's kLinearScore path beyond ALiBi's s + slope (kv - q).
  kernels::AttentionVariant linear{"attention_linear_bias"};
  linear.score_mod = [](const Tile& score, const kernels::ScoreIndex& at) {
    auto slope = (at.h + 1).to(DType::f32) * 0.01;
    return score * 0.75 + slope * at.kv.to(DType::f32) - (at.q.to(DType::f32) * 0.02 - 0.5);
  };
  out.push_back({linear,
                 {.score = [](double s, int64_t, int64_t h, int64_t i, int64_t j) {
                    return 0.75 * s + 0.01 * static_cast<double>(h + 1) * static_cast<double>(j) - 0.02 * static_cast<double>(i) + 0.5;
                  }}});
  // A factor around a non-linear score hook that is negative: folded into the softmax scale, it
  // turns the row max into a row min.
  kernels::AttentionVariant flipped{"attention_flipped_tanh"};
  flipped.score_mod = [](const Tile& score, const kernels::ScoreIndex&) { return tanh(score * 0.5) * -3.0; };
  out.push_back({flipped, {.score = [](double s, int64_t, int64_t, int64_t, int64_t) { return -3.0 * std::tanh(s / 2.0); }}});
  out.push_back({kernels::softcap_variant(2.0, false),
                 {.score = [](double s, int64_t, int64_t, int64_t, int64_t) { return 2.0 * std::tanh(s / 2.0); }}});
  out.push_back({kernels::prefix_lm_variant(),
                 {.keep = [](int64_t b, int64_t, int64_t i, int64_t j) { return j <= i || j < prefix_of(b); }},
                 prefix_tensor});
  out.push_back({kernels::document_variant(static_cast<int64_t>(kCuSeqlens.size()) - 1, true),
                 {.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i && document_of(i) == document_of(j); }},
                 cu_seqlens_tensor});
  out.push_back({kernels::segment_variant(64),
                 {.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return i / 64 == j / 64; }}});
  if (heads == kMaskHeads) {
    out.push_back({kernels::block_mask_variant(kCell, kCell),
                   {.keep = [](int64_t, int64_t h, int64_t i, int64_t j) { return cell_kept(h, i / kCell, j / kCell); }},
                   block_mask_tensor});
    out.push_back({kernels::block_mask_variant(kCell, kCell, true),
                   {.keep = [](int64_t, int64_t h, int64_t i, int64_t j) { return j <= i && cell_kept(h, i / kCell, j / kCell); }},
                   block_mask_tensor});
  }
  return out;
}

// A tensor's float64 values.
struct F64 {
  std::vector<int64_t> shape;
  std::vector<double> v;
};
F64 f64_of(const HostTensor& t) { return {t.shape(), t.values()}; }

// float64 attention with a variant's meaning; q [B,H,Sq,D], k / v [B,Hkv,Skv,D].
std::vector<double> variant_f64(const F64& q, const F64& k, const F64& v, const VariantMeaning& vm) {
  const int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Skv = k.shape[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const std::vector<double>&qv = q.v, &kv = k.v, &vv = v.v;
  std::vector<double> out(qv.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      const double* K = &kv[(b * Hkv + hk) * Skv * D];
      const double* V = &vv[(b * Hkv + hk) * Skv * D];
      for (int64_t i = 0; i < Sq; ++i) {
        const double* Q = &qv[((b * H + h) * Sq + i) * D];
        std::vector<double> s(Skv, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < Skv; ++j) {
          if (!vm.keep(b, h, i, j)) continue;
          double d = 0;
          for (int64_t t = 0; t < D; ++t) d += Q[t] * K[j * D + t];
          s[j] = vm.score(d * scale, b, h, i, j);
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) continue;   // no key: O = 0
        double l = 0;
        std::vector<double> acc(D, 0.0);
        for (int64_t j = 0; j < Skv; ++j) {
          if (s[j] == -INFINITY) continue;
          const double p = std::exp(s[j] - mx);
          l += p;
          for (int64_t t = 0; t < D; ++t) acc[t] += p * V[j * D + t];
        }
        for (int64_t t = 0; t < D; ++t) out[((b * H + h) * Sq + i) * D + t] = acc[t] / l;
      }
    }
  return out;
}

HostTensor cast_to(const HostTensor& x, DType dt) {
  HostTensor y(dt, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) y.set(i, x.at(i));
  return y;
}

// e4m3 copies with descales per (b, h) -- what attention_fp8 reads: Q's per query head, K's and
// V's per kv head -- V transposed and padded to 16 keys. x = x8 * descale.
struct Fp8Operands {
  HostTensor q8, k8, vt8, qd, kd, vd;
};
HostTensor per_head_e4m3(const HostTensor& x, HostTensor& descale, bool transpose) {
  const auto& s = x.shape();
  const int64_t BH = s[0] * s[1], S = s[2], D = s[3], S_pad = (S + 15) / 16 * 16;
  HostTensor out(DType::e4m3, transpose ? std::vector<int64_t>{s[0], s[1], D, S_pad} : s);
  out.fill_bytes(0);
  for (int64_t g = 0; g < BH; ++g) {
    double amax = 0;
    for (int64_t i = 0; i < S * D; ++i) amax = std::max(amax, std::fabs(x.at(g * S * D + i)));
    descale.set(g, amax > 0 ? amax / 448.0 : 1.0);
  }
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t r = 0; r < S; ++r)
      for (int64_t d = 0; d < D; ++d) {
        const double val = x.at((bh * S + r) * D + d) / descale.at(bh);
        out.set(transpose ? (bh * D + d) * S_pad + r : (bh * S + r) * D + d, val);
      }
  return out;
}
Fp8Operands quantize(const HostTensor& q, const HostTensor& k, const HostTensor& v) {
  HostTensor qd(DType::f32, {q.shape()[0], q.shape()[1]}), kd(DType::f32, {k.shape()[0], k.shape()[1]}),
      vd(DType::f32, {k.shape()[0], k.shape()[1]});
  HostTensor q8 = per_head_e4m3(q, qd, false), k8 = per_head_e4m3(k, kd, false), vt8 = per_head_e4m3(v, vd, true);
  return Fp8Operands{q8, k8, vt8, qd, kd, vd};
}

// Dequantized float64 values of an e4m3 tensor and its per-(b, h) descales (V: untransposed).
F64 dequantized(const HostTensor& x8, const HostTensor& ds, bool transposed, int64_t S) {
  const auto& s = x8.shape();
  const int64_t D = transposed ? s[2] : s[3];
  F64 out{{s[0], s[1], S, D}, std::vector<double>(s[0] * s[1] * S * D)};
  for (int64_t bh = 0; bh < s[0] * s[1]; ++bh)
    for (int64_t r = 0; r < S; ++r)
      for (int64_t d = 0; d < D; ++d)
        out.v[(bh * S + r) * D + d] =
            x8.at(transposed ? (bh * D + d) * s[3] + r : (bh * S + r) * D + d) * ds.at(bh);
  return out;
}

struct Problem {
  int64_t B, H, Hkv, Sq, Skv, D;
};

// The variant kernel's arguments for inputs in the kernel's dtypes.
std::vector<Arg> variant_args(const std::vector<TensorView>& in, const TensorView& o, const TensorView& lse,
                              const TensorView* prefix, int64_t D, bool with_lse = true) {
  std::vector<Arg> a = {in[0], in[1], in[2], in[3], in[4], in[5], o, lse,
                        1.4426950408889634 / std::sqrt(static_cast<double>(D)), 1.0, false, with_lse};
  if (prefix) a.push_back(*prefix);
  return a;
}

HostTensor prefix_tensor(int64_t B) {
  HostTensor p(DType::i64, {B});
  for (int64_t b = 0; b < B; ++b) p.set(b, static_cast<double>(prefix_of(b)));
  return p;
}

// attention_fp8's argument specs for e4m3 inputs [1, 16, S, D] (V transposed), bf16 output, no LSE.
std::vector<ArgSpec> fp8_variant_specs(int64_t S, int64_t D) {
  TensorSpec q{DType::e4m3, {1, 16, S, D}}, ds{DType::f32, {1, 16}};
  return {q, q, TensorSpec{DType::e4m3, {1, 16, D, S}}, ds, ds, ds, TensorSpec{DType::bf16, {1, 16, S, D}},
          TensorSpec{DType::f32, {1, 16, S}}, RuntimeScalar{0.1f}, RuntimeScalar{1.0f}, false, false};
}

Config variant_config(int64_t m, int64_t n, bool block_skip = true) {
  Config c;
  c.blocks = {{"m", m}, {"n", n}};
  if (!block_skip) c.knobs["attn_block_skip"] = 0;
  return c;
}

// The variant's inputs in `dt` (bf16 / f16: as given with unit descales; e4m3: quantized),
// and the float64 values those inputs stand for.
struct KernelInputs {
  std::vector<HostTensor> t;    // q, k, v(t), qd, kd, vd
  F64 q64, k64, v64;
};
KernelInputs kernel_inputs(DType dt, const HostTensor& q, const HostTensor& k, const HostTensor& v) {
  KernelInputs r;
  if (is_fp8(dt)) {
    Fp8Operands f = quantize(q, k, v);
    r.q64 = dequantized(f.q8, f.qd, false, q.shape()[2]);
    r.k64 = dequantized(f.k8, f.kd, false, k.shape()[2]);
    r.v64 = dequantized(f.vt8, f.vd, true, v.shape()[2]);
    r.t = {f.q8, f.k8, f.vt8, f.qd, f.kd, f.vd};
  } else {
    const HostTensor q_ones = filled(DType::f32, {q.shape()[0], q.shape()[1]}, 1.0),
                     kv_ones = filled(DType::f32, {k.shape()[0], k.shape()[1]}, 1.0);
    r.t = {cast_to(q, dt), cast_to(k, dt), cast_to(v, dt), q_ones, kv_ones, kv_ones};
    r.q64 = f64_of(r.t[0]);
    r.k64 = f64_of(r.t[1]);
    r.v64 = f64_of(r.t[2]);
  }
  return r;
}

// Host tensors on the GPU, and views of them in the same order.
struct OnDevice {
  std::vector<DeviceTensor> tensors;
  std::vector<TensorView> views;
};
OnDevice on_device(const std::vector<HostTensor>& host) {
  OnDevice d;
  for (const auto& t : host) d.tensors.push_back(DeviceTensor::from_host(t));
  for (const auto& t : d.tensors) d.views.push_back(t.view());
  return d;
}

std::vector<ArgSpec> specs_without_last(std::vector<ArgSpec> s) {
  s.pop_back();
  return s;
}

// LSE: equal infinities (rows without keys) and the largest difference elsewhere.
struct LseDiff {
  double max_abs = 0;
  int64_t mismatched_inf = 0, nan = 0;
};
LseDiff compare_lse(const std::vector<double>& got, const std::vector<double>& ref) {
  LseDiff d;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) ++d.nan;
    else if (std::isinf(ref[i]) || std::isinf(got[i])) d.mismatched_inf += got[i] != ref[i];
    else d.max_abs = std::max(d.max_abs, std::fabs(got[i] - ref[i]));
  }
  return d;
}

std::vector<TensorView> views(const std::vector<HostTensor>& t) {
  std::vector<TensorView> v;
  for (const auto& x : t) v.push_back(x.view());
  return v;
}

}  // namespace

TEST_CASE("attention variants on the CPU reference executor match float64 (bf16, e4m3, GQA, tails, Sq != Skv)") {
  std::mt19937 rng(71);
  const Problem p{2, 4, 2, 150, 170, 64};
  for (const NamedVariant& nv : variants(p.H)) {
    Kernel k = kernels::attention_variant(nv.variant);
    HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng), kk = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng),
               v = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
    HostTensor extra = nv.input ? nv.input(p.B) : prefix_tensor(p.B);
    const TensorView extra_view = extra.view();
    for (DType dt : {DType::bf16, DType::e4m3}) {
      INFO(nv.variant.name << " " << name(dt));
      KernelInputs in = kernel_inputs(dt, q, kk, v);
      HostTensor o(DType::bf16, {p.B, p.H, p.Sq, p.D}), lse(DType::f32, {p.B, p.H, p.Sq});
      o.fill_bytes(0xFF);
      run_ref(k, variant_args(views(in.t), o.view(), lse.view(), nv.input ? &extra_view : nullptr, p.D),
              variant_config(64, 64));
      // The kernel's quantization error aside, it computes the variant: compare with float64 on
      // the values it was given (e4m3: the dequantized inputs).
      Metrics m = compare(o.values(), variant_f64(in.q64, in.k64, in.v64, nv.meaning));
      MESSAGE(nv.variant.name << " " << name(dt) << " vs float64: " << str(m));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= (is_fp8(dt) ? 4e-2 : 1e-2));
    }
  }
}

TEST_CASE("attention variants: the sm_90a lowering recognizes each one and inlines its hooks (NVRTC, wgmma)") {
  const Problem p{1, 4, 2, 1000, 1000, 128};
  for (const NamedVariant& nv : variants(p.H))
    for (DType dt : {DType::e4m3, DType::bf16}) {
      INFO(nv.variant.name << " " << name(dt));
      Kernel k = kernels::attention_variant(nv.variant);
      TensorSpec q{dt, {p.B, p.H, p.Sq, p.D}}, kk{dt, {p.B, p.Hkv, p.Skv, p.D}};
      TensorSpec v = is_fp8(dt) ? TensorSpec{dt, {p.B, p.Hkv, p.D, 1008}} : kk;
      TensorSpec qds{DType::f32, {p.B, p.H}}, ds{DType::f32, {p.B, p.Hkv}};
      std::vector<ArgSpec> specs = {q, kk, v, qds, ds, ds, TensorSpec{DType::bf16, {p.B, p.H, p.Sq, p.D}},
                                    TensorSpec{DType::f32, {p.B, p.H, p.Sq}}, RuntimeScalar{0.1f}, RuntimeScalar{1.0f},
                                    false, false};
      if (nv.input) {
        HostTensor x = nv.input(p.B);
        specs.push_back(TensorSpec{x.dtype(), x.shape()});
      }
      ir::Function f = k.trace(specs);
      auto m = codegen::match_attention_fp8(f);
      REQUIRE(m.has_value());
      CHECK(m->score_mod == static_cast<bool>(nv.variant.score_mod));
      CHECK(m->mask_mod == static_cast<bool>(nv.variant.mask_mod));
      CHECK(ir::print(f).find(nv.variant.mask_mod ? "#mask_mod" : "#score_mod") != std::string::npos);
      const CompiledKernel& ck = compile(k, specs, variant_config(128, 128), CompileRequest{"sm_90a", true, false});
      CHECK(ck.generated.lowering == "sm90_attention");
      // A mask of exactly kv <= q (causal, ALiBi's) becomes the kernel's built-in causal mask; a
      // score hook stays. With block skipping off, the mask stays a hook (every block visited).
      // (16-bit inputs with a score hook keep the mask hook by default: measured faster)
      const bool causal_mask = nv.variant.name == "attention_causal" || nv.variant.name.find("alibi") != std::string::npos;
      const bool built_in = causal_mask && (is_fp8(dt) || !nv.variant.score_mod);
      // Masks that and kv <= q with more (windows, causal documents and block masks): the causal
      // part built in, the rest a hook.
      const bool causal_part = !causal_mask && (nv.variant.name.find("sliding") != std::string::npos ||
                                                nv.variant.name.find("_causal") != std::string::npos);
      // prefix-LM's kv <= q || kv < prefix: the built-in causal mask with each row's bound raised to
      // prefix - 1, the hooks only for causal_prefix() (the prefix length it reads)
      const bool prefix = nv.variant.name == "attention_prefix_lm";
      const std::string& src = ck.generated.source;
      if (built_in) {
        CHECK(src.find("causal: yes, the mask hook's kv <= q as the built-in causal mask, with_lse") != std::string::npos);
        CHECK((src.find("struct tj_hooks") != std::string::npos) == static_cast<bool>(nv.variant.score_mod));
        CHECK(src.find("kMask = true") == std::string::npos);
      } else if (prefix) {
        CHECK(src.find("kv <= q || kv < prefix as the built-in causal mask") != std::string::npos);
        CHECK(src.find("kMask = false") != std::string::npos);
        CHECK(src.find("int causal_prefix() const {\n    return v") != std::string::npos);
      } else {
        CHECK(src.find("struct tj_hooks") != std::string::npos);
        if (nv.variant.mask_mod) CHECK(src.find("kSkipBlocks = true") != std::string::npos);
        // a keep() that gathers per element (the block mask's cells) runs in a rolled loop
        const bool gathers = nv.variant.name.find("block_mask") != std::string::npos;
        if (nv.variant.mask_mod) CHECK((src.find("kKeepGathers = true") != std::string::npos) == gathers);
        CHECK((src.find("the built-in causal mask, the rest of it a hook") != std::string::npos) == causal_part);
      }
      if (built_in || causal_part || prefix) {
        const CompiledKernel& no_skip = compile(k, specs, variant_config(128, 128, false), CompileRequest{"sm_90a", false, false});
        CHECK(no_skip.generated.source.find("kMask = true") != std::string::npos);
        CHECK(no_skip.generated.source.find("kSkipBlocks = false") != std::string::npos);
        CHECK(no_skip.generated.source.find("(causal: no") != std::string::npos);
        Config keep_hook = variant_config(128, 128);
        keep_hook.knobs["attn_causal_hook"] = 1;
        const CompiledKernel& hooked = compile(k, specs, keep_hook, CompileRequest{"sm_90a", false, false});
        CHECK(hooked.generated.source.find("kMask = true") != std::string::npos);
        CHECK(hooked.generated.source.find("kSkipBlocks = true") != std::string::npos);
        CHECK(hooked.generated.source.find("(causal: no") != std::string::npos);
        // and the autotuner may try both
        bool listed = false;
        for (const auto& knob : autotune::registered_knobs(f, "sm_90a")) listed |= knob.name == "attn_causal_hook";
        CHECK(listed);
      }
      // ALiBi's (float)(kv - q): float arithmetic on the positions the main loop passes as floats
      // (no int -> float conversion per score element)
      const bool alibi = nv.variant.name.find("alibi") != std::string::npos;
      if (alibi) CHECK(ck.generated.source.find("(tj_kvf - tj_qf)") != std::string::npos);
      // Scores linear in s and the positions (ALiBi, the linear bias) are also written as their
      // coefficients, which the main loop uses instead of score(); knob attn_linear_score = 0 keeps
      // score() per element. softcap's tanh is not linear.
      const bool linear = alibi || nv.variant.name == "attention_linear_bias";
      CHECK((src.find("kLinearScore = true") != std::string::npos) == linear);
      if (alibi) {
        CHECK(src.find("tj_a = ((float)(v") != std::string::npos);
        CHECK(src.find("tj_d = 1.0f;") != std::string::npos);
      }
      if (linear) {
        Config per_element = variant_config(128, 128);
        per_element.knobs["attn_linear_score"] = 0;
        const CompiledKernel& pe = compile(k, specs, per_element, CompileRequest{"sm_90a", false, false});
        CHECK(pe.generated.source.find("kLinearScore = false") != std::string::npos);
      }
      // softcap's 1 / cap and cap (the flipped tanh's 0.5 and -3) fold into the score and softmax
      // scales; with knob fast_math its tanh is tanh.approx.f32.
      if (nv.variant.name.find("softcap") != std::string::npos || nv.variant.name == "attention_flipped_tanh") {
        const bool softcap = nv.variant.name.find("softcap") != std::string::npos;
        CHECK(src.find("score_in_factor() const { return (float)(0.5f); }") != std::string::npos);
        CHECK(src.find(softcap ? "score_out_factor() const { return (float)(2.0f); }"
                               : "score_out_factor() const { return (float)((-3.0f)); }") != std::string::npos);
        CHECK(src.find("tanhf((tj_s))") != std::string::npos);
        Config fast = variant_config(128, 128);
        fast.knobs["fast_math"] = 1;
        const CompiledKernel& fk = compile(k, specs, fast, CompileRequest{"sm_90a", false, false});
        CHECK(fk.generated.source.find("tj::dev::fast_tanh((tj_s))") != std::string::npos);
      }
      bool linear_knob = false;
      for (const auto& knob : autotune::registered_knobs(f, "sm_90a")) linear_knob |= knob.name == "attn_linear_score";
      CHECK(linear_knob == linear);
      // the block mask: read per element by a gather, per key block by a range query
      if (nv.variant.name.find("block_mask") != std::string::npos) {
        CHECK(ck.generated.source.find("tj::dev::gather_at<tj::dev::i32>") != std::string::npos);
        CHECK(ck.generated.source.find("tj::dev::iv_gather<int>") != std::string::npos);
      }
      CHECK(ck.ptx.find("wgmma.mma_async.sync.aligned") != std::string::npos);
      CHECK(ck.ptx.find(is_fp8(dt) ? ".e4m3.e4m3" : ".bf16.bf16") != std::string::npos);
    }
}

TEST_CASE("attention variants: their default configs assemble without serialized wgmmas (ptxas -v)") {
  // What a config-less launch takes (attention_variant_default_config: the variant's key blocks) at
  // 2048 keys (fp8 64 x 64 with a producer warp for documents and block masks, 64 x 128 / 64 x 192
  // for the rest) and 8192 (64 x 128, 192 x 96). With the softmax / P.V overlap in 64 x 64 tiles of
  // 128 registers, ptxas serialized every wgmma (C7512) and spilled (H100: documents and
  // block masks 7-11% slower at S 2048). bf16: 128 x 128, 64 x 64 for documents and block masks.
  const codegen::Target t = codegen::Target::parse("sm_90a");
  for (const NamedVariant& nv : variants(kMaskHeads))
    for (const auto& [dt, S] : {std::pair{DType::e4m3, int64_t{2048}}, std::pair{DType::e4m3, int64_t{8192}},
                               std::pair{DType::bf16, int64_t{2048}}}) {
      const Problem p{1, kMaskHeads, kMaskHeads, S, S, 128};
      Kernel k = kernels::attention_variant(nv.variant);
      TensorSpec q{dt, {p.B, p.H, p.Sq, p.D}}, kk{dt, {p.B, p.Hkv, p.Skv, p.D}}, ds{DType::f32, {p.B, p.Hkv}};
      std::vector<ArgSpec> specs = {q, kk, is_fp8(dt) ? TensorSpec{dt, {p.B, p.Hkv, p.D, p.Skv}} : kk, ds, ds, ds,
                                    TensorSpec{DType::bf16, {p.B, p.H, p.Sq, p.D}}, TensorSpec{DType::f32, {p.B, p.H, p.Sq}},
                                    RuntimeScalar{0.1f}, RuntimeScalar{1.0f}, false, false};
      if (nv.input) {
        HostTensor x = nv.input(p.B);
        specs.push_back(TensorSpec{x.dtype(), x.shape()});
      }
      const ir::Function f = k.trace(specs);
      const auto m = codegen::match_attention_fp8(f);
      REQUIRE(m.has_value());
      const Config d = kernels::attention_variant_default_config(f.name, dt, p.D, m->causal || m->mask_mod, p.D, S);
      INFO(nv.variant.name << " " << name(dt) << " S " << S << " config " << d.to_json());
      const codegen::GeneratedKernel g = codegen::generate_cuda(f, d, t);
      REQUIRE(g.lowering == "sm90_attention");
      runtime::CompileResult r;
      REQUIRE_NOTHROW(r = tj_test::nvrtc(g, "sm_90a", true, true));
      const tj_test::PtxasInfo info = tj_test::ptxas_info(r.log);
      MESSAGE(fmt::format("{} {} S {} {}: {} registers, spills {}/{} bytes", nv.variant.name, name(dt), S, d.to_json(),
                          info.registers, info.spill_stores, info.spill_loads));
      INFO(r.log);
      CHECK(r.log.find("Potential Performance Loss") == std::string::npos);
    }
}

TEST_CASE("attention variants: score hooks linear in the score and the positions are written as coefficients, others per element") {
  struct Case {
    const char* what;
    kernels::ScoreMod mod;
    bool linear;
    const char* expected;       // in the source: coefficients where linear, else the folded factors
  };
  auto f32 = [](const Tile& t) { return t.to(DType::f32); };
  const std::vector<Case> cases = {
      {"negated score plus a key term", [&](const Tile& s, const kernels::ScoreIndex& at) { return -s + f32(at.kv) * 3.0; },
       true, "tj_d = (-1.0f);"},
      {"a per-batch input times the query position",
       [&](const Tile& s, const kernels::ScoreIndex& at) { return s + at.inputs[0].load(at.b).to(DType::f32) * f32(at.q); },
       true, "tj_a = 0.0f;"},
      {"a temperature alone", [](const Tile& s, const kernels::ScoreIndex&) { return s * 0.5; }, true, "tj_b = 0.0f;"},
      {"the score times a position", [&](const Tile& s, const kernels::ScoreIndex& at) { return s * f32(at.kv - at.q); },
       false, "kLinearScore = false"},
      {"a product of positions", [&](const Tile& s, const kernels::ScoreIndex& at) { return s + f32(at.kv) * f32(at.q); },
       false, "kLinearScore = false"},
      {"an integer product of positions", [&](const Tile& s, const kernels::ScoreIndex& at) { return s + f32(at.kv * at.q); },
       false, "kLinearScore = false"},
      {"a function of the score", [](const Tile& s, const kernels::ScoreIndex&) { return exp2(s * 0.1); }, false,
       "score_in_factor() const { return (float)(0.1f); }"},
      // the score read twice: neither factor folds (the other read needs s itself)
      {"the score read twice", [](const Tile& s, const kernels::ScoreIndex&) { return tanh(s * 0.5) * 2.0 + s * 0.1; },
       false, "score_in_factor() const { return 1.0f; }"},
  };
  const codegen::Target t = codegen::Target::parse("sm_90a");
  for (const Case& c : cases) {
    INFO(c.what);
    kernels::AttentionVariant v{"attention_linear_probe"};
    v.score_mod = c.mod;
    v.inputs = {"per_batch"};
    const int64_t S = 512, D = 128;
    TensorSpec q{DType::e4m3, {2, 4, S, D}}, ds{DType::f32, {2, 4}};
    std::vector<ArgSpec> specs = {q, q, TensorSpec{DType::e4m3, {2, 4, D, S}}, ds, ds, ds,
                                  TensorSpec{DType::bf16, {2, 4, S, D}}, TensorSpec{DType::f32, {2, 4, S}},
                                  RuntimeScalar{0.1f}, RuntimeScalar{1.0f}, false, false, TensorSpec{DType::f32, {2}}};
    const ir::Function f = kernels::attention_variant(v).trace(specs);
    const codegen::GeneratedKernel g = codegen::generate_cuda(f, variant_config(64, 128), t);
    REQUIRE(g.lowering == "sm90_attention");
    CHECK((g.source.find("kLinearScore = true") != std::string::npos) == c.linear);
    CHECK(g.source.find(c.expected) != std::string::npos);
    // score() stays, for the per-element path (knob attn_linear_score = 0)
    CHECK(g.source.find("float score(float tj_s") != std::string::npos);
  }
}

TEST_CASE("attention variants: uniform work (non-causal segments) keeps the tiles' natural order, and fp8 64 x 128 loads its own K and V") {
  const std::string seg = kernels::attention_variant(kernels::segment_variant(2048)).name();
  const std::string seg_causal = kernels::attention_variant(kernels::segment_variant(2048, true)).name();
  kernels::AttentionVariant user{"attention_user_uniform"};
  user.mask_mod = [](const kernels::ScoreIndex& at) { return at.kv >= 0; };
  user.uniform_work = true;
  const std::string uniform = kernels::attention_variant(user).name();
  for (int64_t S : {2048, 8192}) {
    CAPTURE(S);
    for (const std::string& name : {seg, uniform}) {
      CAPTURE(name);
      const Config f8 = kernels::attention_variant_default_config(name, DType::e4m3, 128, true, 128, S);
      CHECK(f8.knob("attn_reverse_tiles", 1) == 0);
      const Config b16 = kernels::attention_variant_default_config(name, DType::bf16, 128, true, 128, S);
      CHECK(b16.knob("attn_reverse_tiles", 1) == 0);
      CHECK(b16.knob("attn_lean_producer", 0) == 0);
    }
    const Config f8 = kernels::attention_variant_default_config(seg, DType::e4m3, 128, true, 128, S);
    CHECK(f8.blocks.at("m") == 64);
    CHECK(f8.blocks.at("n") == 128);
    CHECK(f8.knob("attn_lean_producer", 0) == 1);
    CHECK(f8.knob("attn_overlap", 1) == 0);
    CHECK(f8.knob("attn_self_load", 0) == 1);
    // merging into o too (dilated attention's masked pairs: three CTAs an SM with a block table of 128)
    kernels::AttentionVariant merging = kernels::segment_variant(2048);
    merging.name += "_merging_test";
    merging.merge_into_output = true;
    const Kernel merging_kernel = kernels::attention_variant(merging);
    const Config m8 = kernels::attention_variant_default_config(merging_kernel.name(), DType::e4m3, 128, true, 128, S);
    CHECK(m8.knob("attn_self_load", 0) == 1);
    if (S == 2048) {
      std::vector<ArgSpec> specs = fp8_variant_specs(S, 128);
      specs.back() = true;   // with_lse: the running logsumexp
      const codegen::GeneratedKernel g =
          codegen::generate_cuda(merging_kernel.trace(specs), m8, codegen::Target::parse("sm_90a"));
      CHECK(g.source.find("__launch_bounds__(128, 3)") != std::string::npos);
    }
    // causal segments: later rows see more keys, so longest first, and the overlapped schedule
    const Config c8 = kernels::attention_variant_default_config(seg_causal, DType::e4m3, 128, true, 128, S);
    CHECK(c8.knob("attn_reverse_tiles", 1) == 1);
    CHECK(c8.knob("attn_lean_producer", 0) == 0);
  }
  // the generated kernel takes its tiles in the natural order
  const codegen::Target t = codegen::Target::parse("sm_90a");
  const int64_t S = 2048, D = 128;
  const std::vector<ArgSpec> specs = fp8_variant_specs(S, D);
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    const kernels::AttentionVariant v = kernels::segment_variant(1024, causal);
    const ir::Function f = kernels::attention_variant(v).trace(specs);
    const codegen::GeneratedKernel g =
        codegen::generate_cuda(f, kernels::attention_variant_default_config(v.name, DType::e4m3, D, true, D, S), t);
    REQUIRE(g.lowering == "sm90_attention");
    CHECK((g.source.find("attn_tile_natural(") != std::string::npos) == !causal);
    CHECK((g.source.find("attn_tile_longest_first(") != std::string::npos) == causal);
    // one consumer warpgroup loading its own K and V: 128 threads, three CTAs an SM; a producer
    // warpgroup: 256
    CHECK(g.source.find(causal ? "__launch_bounds__(256," : "__launch_bounds__(128, 3)") != std::string::npos);
  }
}

TEST_CASE("attention variants: exp2s off the MUFU by default: softcap's fp8 192-row tiles 4 of 8 without an LSE (f16x2 pairs) and 1 with one, fp8 64 x 128 producer-warp tiles 2 (segments 3) without one") {
  const kernels::AttentionVariant v = kernels::softcap_variant(30, true);
  const std::string name = kernels::attention_variant(v).name();
  const int64_t S = 8192, D = 128;
  const Config no_lse = kernels::attention_variant_default_config(name, DType::e4m3, D, true, D, S, false);
  const Config lse = kernels::attention_variant_default_config(name, DType::e4m3, D, true, D, S, true);
  REQUIRE(no_lse.blocks.at("m") == 192);
  CHECK(no_lse.knob("attn_exp2_fma", 0) == 4);
  CHECK(lse.knob("attn_exp2_fma", 0) == 1);
  CHECK(kernels::attention_variant_default_config(name, DType::bf16, D, true, D, S).knob("attn_exp2_fma", 0) == 0);
  // the lowering's Cfg: ..., with_lse, f16 pairs> -- pairs only where P goes to e4m3 straight
  const codegen::Target t = codegen::Target::parse("sm_90a");
  std::vector<ArgSpec> specs = fp8_variant_specs(S, D);
  const ir::Function f = kernels::attention_variant(v).trace(specs);
  // (..., f32 row sums, f16 pairs, merging, LSE written, self-loading, block-class table>)
  CHECK(codegen::generate_cuda(f, no_lse, t).source.find(", false, true, false, false, false, true>;") != std::string::npos);
  Config f32_path = no_lse;
  f32_path.knobs["attn_exp2_f16"] = 0;
  CHECK(codegen::generate_cuda(f, f32_path, t).source.find(", false, false, false, false, false, true>;") != std::string::npos);
  specs.back() = true;   // with_lse
  const ir::Function f_lse = kernels::attention_variant(v).trace(specs);
  CHECK(codegen::generate_cuda(f_lse, lse, t).source.find(", true, false, false, true, false, true>;") != std::string::npos);
  // knob attn_lse_e4m3_sums: the LSE from the e4m3 P's sums, the main loop without f32 row sums
  Config e4m3_sums = no_lse;
  e4m3_sums.knobs["attn_lse_e4m3_sums"] = 1;
  CHECK(codegen::generate_cuda(f_lse, e4m3_sums, t).source.find(", false, true, false, true, false, true>;") != std::string::npos);
  // fp8 64 x 128 tiles with a producer warp (dense rows of up to 2048 keys, segments) without an
  // LSE: 2 of 8 (segments 3); with one, or on other tiles, none
  const std::string seg = kernels::attention_variant(kernels::segment_variant(2048)).name();
  for (const std::string& kernel : {std::string(), seg}) {
    CAPTURE(kernel);
    const Config d = kernels::attention_variant_default_config(kernel, DType::e4m3, D, kernel == seg, 0, 2048, false);
    CHECK(d.blocks.at("n") == 128);
    CHECK(d.knob("attn_lean_producer", 0) == 1);
    CHECK(d.knob("attn_exp2_fma", 0) == (kernel == seg ? 3 : 2));
    CHECK(kernels::attention_variant_default_config(kernel, DType::e4m3, D, kernel == seg, 0, 2048, true).knob("attn_exp2_fma", 0) == 0);
  }
  CHECK(kernels::attention_variant_default_config("", DType::e4m3, D, false, 0, 8192, false).knob("attn_exp2_fma", 0) == 0);
  CHECK(kernels::attention_variant_default_config("", DType::bf16, D, false, 0, 2048, false).knob("attn_exp2_fma", 0) == 0);
}

TEST_CASE("attention variants: fp8 keys by parity by default, except a linear score hook with three consumers") {
  // K loaded even keys first is fp8's default for P's key order; ALiBi on 192-row tiles measured
  // faster with V permuted instead (codegen/lower_attention_sm90.cpp), at other tiles by parity.
  const codegen::Target t = codegen::Target::parse("sm_90a");
  const std::vector<ArgSpec> specs = fp8_variant_specs(512, 128);
  struct Case {
    kernels::AttentionVariant v;
    int64_t bm, bn;
    bool parity;
  };
  const std::vector<Case> cases = {{kernels::alibi_variant(16, true), 192, 96, false},
                                   {kernels::alibi_variant(16, true), 64, 128, true},
                                   {kernels::softcap_variant(30, true), 192, 96, true},
                                   {kernels::causal_variant(), 192, 96, true}};
  for (const Case& c : cases) {
    INFO(c.v.name << " m=" << c.bm << " n=" << c.bn);
    const ir::Function f = kernels::attention_variant(c.v).trace(specs);
    const codegen::GeneratedKernel g = codegen::generate_cuda(f, variant_config(c.bm, c.bn), t);
    REQUIRE(g.lowering == "sm90_attention");
    REQUIRE(g.tma.size() == 3);
    CHECK(g.tma[1].element_strides == (c.parity ? std::vector<int>{1, 1, 2, 1} : std::vector<int>{}));
    CHECK((g.source.find("(its other warps permute V's keys for a shuffle-free P)") != std::string::npos) == !c.parity);
    // asked for, ALiBi takes it at 192 rows too
    Config cfg = variant_config(c.bm, c.bn);
    cfg.knobs["attn_keys_by_parity"] = 1;
    CHECK(codegen::generate_cuda(f, cfg, t).tma[1].element_strides == std::vector<int>{1, 1, 2, 1});
  }
}

namespace {
// attention_fp8's arguments for e4m3 inputs of [1, 2, 300, 128] (V transposed and padded), bf16 out.
std::vector<ArgSpec> mask_test_specs() {
  const Problem p{1, 2, 2, 300, 300, 128};
  TensorSpec q{DType::e4m3, {p.B, p.H, p.Sq, p.D}}, kk{DType::e4m3, {p.B, p.Hkv, p.Skv, p.D}};
  TensorSpec v{DType::e4m3, {p.B, p.Hkv, p.D, 304}}, ds{DType::f32, {p.B, p.Hkv}};
  return {q, kk, v, ds, ds, ds, TensorSpec{DType::bf16, {p.B, p.H, p.Sq, p.D}}, TensorSpec{DType::f32, {p.B, p.H, p.Sq}},
          RuntimeScalar{0.1f}, RuntimeScalar{1.0f}, false, false};
}
}  // namespace

TEST_CASE("attention variants: a mask's kv <= q (or q >= kv), alone or and-ed with the rest, becomes the built-in causal mask") {
  const std::vector<ArgSpec> specs = mask_test_specs();
  enum Causal { none, whole, part, prefix };
  struct Case {
    const char* name;
    kernels::MaskMod mask;
    Causal causal;
  };
  using At = kernels::ScoreIndex;
  const std::vector<Case> cases = {
      {"attention_mask_le", [](const At& at) { return at.kv <= at.q; }, whole},
      {"attention_mask_ge", [](const At& at) { return at.q >= at.kv; }, whole},
      {"attention_mask_lt", [](const At& at) { return at.kv < at.q; }, none},     // strict: not causal
      {"attention_mask_shift", [](const At& at) { return at.kv <= at.q + 1; }, none},
      {"attention_mask_swapped", [](const At& at) { return at.q <= at.kv; }, none},   // anti-causal
      {"attention_mask_and", [](const At& at) { return at.q - at.kv < 100 && at.kv <= at.q; }, part},
      {"attention_mask_and3", [](const At& at) { return (at.kv <= at.q && at.kv > 7) && at.q < 250; }, part},
      // prefix-LM: every row also sees the keys below a bound that is the same over a CTA
      {"attention_mask_or", [](const At& at) { return at.kv <= at.q || at.kv < 4; }, prefix},
      {"attention_mask_or_swapped", [](const At& at) { return at.kv < 4 || at.q >= at.kv; }, prefix},
      {"attention_mask_or_head", [](const At& at) { return at.kv <= at.q || at.kv < at.h * 8; }, prefix},
      {"attention_mask_or_rows", [](const At& at) { return at.kv <= at.q || at.q < 4; }, none},   // rows, not keys
      {"attention_mask_or_shift", [](const At& at) { return at.kv <= at.q || at.kv < at.q + 4; }, none},
      {"attention_mask_or_strict", [](const At& at) { return at.kv < at.q || at.kv < 4; }, none},
      // kv <= q read again under the and: c && f(c) == c && f(true), so still the causal part
      {"attention_mask_reused", [](const At& at) {
         Tile c = at.kv <= at.q;
         return c && (c || at.kv < 4) && at.kv > 7;
       }, part},
      {"attention_mask_not_and", [](const At& at) { return !(at.kv <= at.q && at.kv > 7); }, none},
  };
  for (const Case& c : cases) {
    const std::string case_name = c.name;
    CAPTURE(case_name);
    kernels::AttentionVariant var{c.name};
    var.mask_mod = c.mask;
    const CompiledKernel& ck =
        compile(kernels::attention_variant(var), specs, variant_config(128, 128), CompileRequest{"sm_90a", false, false});
    const std::string& src = ck.generated.source;
    CHECK(ck.generated.lowering == "sm90_attention");
    CHECK((src.find("the built-in causal mask") != std::string::npos) == (c.causal != none));
    CHECK((src.find("the rest of it a hook") != std::string::npos) == (c.causal == part));
    CHECK((src.find("kMask = true") != std::string::npos) == (c.causal == none || c.causal == part));
    const bool reads_prefix = src.find("struct tj_hooks") != std::string::npos &&
                              src.find("int causal_prefix() const {\n    return 0;") == std::string::npos;
    CHECK(reads_prefix == (c.causal == prefix));
  }
}

TEST_CASE("attention variants: an integer compared with itself classifies whole key blocks (kv == kv holds, kv < kv never)") {
  const std::vector<ArgSpec> specs = mask_test_specs();
  using At = kernels::ScoreIndex;
  for (bool holds : {true, false}) {
    kernels::AttentionVariant var{holds ? "attention_mask_self_eq" : "attention_mask_self_lt"};
    var.mask_mod = [holds](const At& at) { return (holds ? at.kv == at.kv : at.kv < at.kv) || at.kv < 200; };
    const std::string src =
        compile(kernels::attention_variant(var), specs, variant_config(128, 128), CompileRequest{"sm_90a", false, false})
            .generated.source;
    INFO(src);
    // The self-comparison's interval is the constant, not that of two independent ranges.
    CHECK(src.find(holds ? "tj::dev::ivb_point(true)" : "tj::dev::ivb_point(false)") != std::string::npos);
  }
}

namespace {

// The two halves of the keys as variants: the first writes o and lse, the second merges into them.
kernels::AttentionVariant keys_below(int64_t split) {
  kernels::AttentionVariant v{fmt::format("attention_keys_below_{}", split)};
  v.mask_mod = [split](const kernels::ScoreIndex& at) { return at.kv < split; };
  return v;
}
kernels::AttentionVariant keys_from_merging(int64_t split) {
  kernels::AttentionVariant v{fmt::format("attention_keys_from_{}_merging", split)};
  v.mask_mod = [split](const kernels::ScoreIndex& at) { return at.kv >= split; };
  v.merge_into_output = true;
  return v;
}
kernels::AttentionVariant all_keys_merging() {
  kernels::AttentionVariant v{"attention_all_keys_merging"};
  v.merge_into_output = true;
  return v;
}

}  // namespace

TEST_CASE("attention variants that merge into their output: launches over disjoint keys add up to attention over all (CPU reference vs float64)") {
  std::mt19937 rng(75);
  const Problem p{1, 2, 2, 90, 130, 64};
  const int64_t split = 50;
  HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng), kk = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng),
             v = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
  for (DType dt : {DType::bf16, DType::e4m3}) {
    INFO(name(dt));
    KernelInputs in = kernel_inputs(dt, q, kk, v);
    const std::vector<double> want = variant_f64(in.q64, in.k64, in.v64, VariantMeaning{});
    const double bound = is_fp8(dt) ? 4e-2 : 1e-2;
    // Keys [0, 50), then [50, 130) merged in.
    HostTensor o(DType::bf16, {p.B, p.H, p.Sq, p.D}), lse(DType::f32, {p.B, p.H, p.Sq});
    o.fill_bytes(0xFF);
    run_ref(kernels::attention_variant(keys_below(split)), variant_args(views(in.t), o.view(), lse.view(), nullptr, p.D),
            variant_config(64, 64));
    run_ref(kernels::attention_variant(keys_from_merging(split)),
            variant_args(views(in.t), o.view(), lse.view(), nullptr, p.D), variant_config(64, 64));
    Metrics two = compare(o.values(), want);
    MESSAGE(name(dt) << ", two launches merged vs float64: " << str(two));
    CHECK(two.nan == 0);
    CHECK(two.rel_rmse <= bound);
    // Nothing yet (lse -inf): whatever o holds (NaN here) does not leak, and the LSE is the part's.
    HostTensor o1(DType::bf16, o.shape()), lse1 = filled(DType::f32, lse.shape(), -INFINITY),
               lse_all(DType::f32, lse.shape());
    o1.fill_bytes(0xFF);
    run_ref(kernels::attention_variant(all_keys_merging()), variant_args(views(in.t), o1.view(), lse1.view(), nullptr, p.D),
            variant_config(64, 64));
    Metrics one = compare(o1.values(), want);
    MESSAGE(name(dt) << ", one launch merged into nothing vs float64: " << str(one));
    CHECK(one.nan == 0);
    CHECK(one.rel_rmse <= bound);
    HostTensor o_all(DType::bf16, o.shape());
    run_ref(kernels::attention_fp8(), variant_args(views(in.t), o_all.view(), lse_all.view(), nullptr, p.D),
            variant_config(64, 64));
    const LseDiff d = compare_lse(lse1.values(), lse_all.values()), d2 = compare_lse(lse.values(), lse_all.values());
    MESSAGE(name(dt) << ", LSE vs attention_fp8's: max abs " << d.max_abs << " (one launch), " << d2.max_abs << " (two)");
    CHECK(d.nan + d.mismatched_inf + d2.nan + d2.mismatched_inf == 0);
    // fp8: the merging LSE sums the e4m3 P, attention_fp8's the f32 P (a few percent apart at most)
    CHECK(d.max_abs <= (is_fp8(dt) ? 5e-2 : 1e-5));
    CHECK(d2.max_abs <= (is_fp8(dt) ? 5e-2 : 1e-4));
  }
}

TEST_CASE("attention variants that merge into their output: bad launches are errors, and sm_90a lowers them (NVRTC)") {
  const Problem p{1, 2, 2, 300, 300, 128};
  Kernel merging = kernels::attention_variant(keys_from_merging(100));
  HostTensor q(DType::bf16, {p.B, p.H, p.Sq, p.D}), ones(DType::f32, {p.B, p.Hkv});
  HostTensor o(DType::bf16, q.shape()), o8(DType::e4m3, q.shape()), lse(DType::f32, {p.B, p.H, p.Sq});
  const std::vector<TensorView> in = {q.view(), q.view(), q.view(), ones.view(), ones.view(), ones.view()};
  CHECK_THROWS_WITH(run_ref(merging, variant_args(in, o.view(), lse.view(), nullptr, p.D, false), variant_config(64, 64)),
                    doctest::Contains("merges into its output: launch it with with_lse = true"));
  CHECK_THROWS_WITH(run_ref(merging, variant_args(in, o8.view(), lse.view(), nullptr, p.D), variant_config(64, 64)),
                    doctest::Contains("merges into its output: o must be bf16 or f16, not e4m3"));
  // Dilated attention's kind: segments (uniform work), merging.
  kernels::AttentionVariant segments = kernels::segment_variant(1024);
  segments.name += "_merging";
  segments.merge_into_output = true;
  merging = kernels::attention_variant(segments);
  const codegen::Target t = codegen::Target::parse("sm_90a");
  for (DType dt : {DType::e4m3, DType::bf16}) {
    INFO(name(dt));
    TensorSpec qs{dt, {p.B, p.H, p.Sq, p.D}}, ds{DType::f32, {p.B, p.Hkv}};
    TensorSpec vs = is_fp8(dt) ? TensorSpec{dt, {p.B, p.Hkv, p.D, 304}} : qs;
    const std::vector<ArgSpec> specs = {qs, qs, vs, ds, ds, ds, TensorSpec{DType::bf16, {p.B, p.H, p.Sq, p.D}},
                                        TensorSpec{DType::f32, {p.B, p.H, p.Sq}}, RuntimeScalar{0.1f},
                                        RuntimeScalar{1.0f}, false, true};
    ir::Function f = merging.trace(specs);
    const auto m = codegen::match_attention_fp8(f);
    REQUIRE(m.has_value());
    CHECK(m->merging);
    CHECK(m->with_lse);
    CHECK(m->mask_mod);
    const Config cfg = kernels::attention_variant_default_config(merging.name(), dt, p.D, true, p.D, 2048, true);
    const codegen::GeneratedKernel g = codegen::generate_cuda(f, cfg, t);
    CHECK(g.lowering == "sm90_attention");
    CHECK(g.starts_early);
    CHECK(g.source.find("with_lse: yes, merged into o and lse") != std::string::npos);
    // The Cfg's last flags: f32 row sums (no: the e4m3 P's, on the tensor cores), the merge, fp8's
    // self-loading tiles (uniform work) and the block-class table (a mask hook)
    if (is_fp8(dt)) {
      CHECK(g.source.find(", false, true, true, true, true, true>;") != std::string::npos);   // kF32RowSums, kExp2F16, kMergeOut, kLseOut, kSelfLoad, kBlockTable
      CHECK(cfg.knob("attn_exp2_fma", 0) == 3);   // as without an LSE (uniform work: 3 of 8)
    } else {
      CHECK(g.source.find(", false, true, true, false, true>;") != std::string::npos);
    }
    const CompiledKernel& ck = compile(merging, specs, cfg, CompileRequest{"sm_90a", true, false});
    CHECK(ck.generated.lowering == "sm90_attention");
  }
}

TEST_CASE("attention variants: hooks it cannot inline take the SIMT path, malformed hooks are errors") {
  // A hook with a row reduction is fine DSL but not elementwise: not inlined.
  kernels::AttentionVariant bias{"attention_row_centered"};
  bias.inputs = {"unused"};
  bias.score_mod = [](const Tile& s, const kernels::ScoreIndex&) { return s - amax(s, 1).col(); };
  Kernel k = kernels::attention_variant(bias);
  TensorSpec t{DType::bf16, {1, 2, 256, 64}}, ds{DType::f32, {1, 2}};
  std::vector<ArgSpec> specs = {t, t, t, ds, ds, ds, t, TensorSpec{DType::f32, {1, 2, 256}}, RuntimeScalar{0.1f},
                                RuntimeScalar{1.0f}, false, false, TensorSpec{DType::f32, {256}}};
  CHECK(codegen::match_attention_fp8(k.trace(specs)).has_value());
  // Not the attention template: the generic lowering takes it (its dots on the tensor cores).
  CHECK(compile(k, specs, variant_config(128, 64), CompileRequest{"sm_90a", false, false}).generated.lowering ==
        "tensor cores (wgmma)");

  kernels::AttentionVariant not_bool{"attention_bad_mask"};
  not_bool.mask_mod = [](const kernels::ScoreIndex& at) { return at.kv - at.q; };
  CHECK_THROWS_WITH(kernels::attention_variant(not_bool).trace(specs_without_last(specs)),
                    doctest::Contains("mask_mod must return a boolean tile"));
  kernels::AttentionVariant int_score{"attention_bad_score"};
  int_score.score_mod = [](const Tile&, const kernels::ScoreIndex& at) { return at.kv - at.q; };
  CHECK_THROWS_WITH(kernels::attention_variant(int_score).trace(specs_without_last(specs)),
                    doctest::Contains("score_mod must return a float tile"));
  CHECK_THROWS_WITH(kernels::attention_variant(kernels::AttentionVariant{}), doctest::Contains("needs a name"));
}

TEST_CASE("gpu: attention variants lowered to sm_90a match the CPU reference executor (bf16, e4m3, block skipping on/off)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(72);
  const Problem p{2, 4, 2, 333, 300, 128};
  for (const NamedVariant& nv : variants(p.H)) {
    Kernel k = kernels::attention_variant(nv.variant);
    HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng), kk = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng),
               v = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
    HostTensor extra = nv.input ? nv.input(p.B) : prefix_tensor(p.B);
    const TensorView extra_view = extra.view();
    DeviceTensor extra_d = DeviceTensor::from_host(extra);
    for (DType dt : {DType::bf16, DType::e4m3}) {
      KernelInputs in = kernel_inputs(dt, q, kk, v);
      // the CPU reference in the GPU runs' key blocks (fp8: P is quantized per key block's max)
      HostTensor o_ref(DType::bf16, {p.B, p.H, p.Sq, p.D}), lse_ref(DType::f32, {p.B, p.H, p.Sq});
      HostTensor o_ref64(DType::bf16, o_ref.shape()), lse_ref64(DType::f32, lse_ref.shape());
      run_ref(k, variant_args(views(in.t), o_ref.view(), lse_ref.view(), nv.input ? &extra_view : nullptr, p.D),
              variant_config(128, 128));
      run_ref(k, variant_args(views(in.t), o_ref64.view(), lse_ref64.view(), nv.input ? &extra_view : nullptr, p.D),
              variant_config(64, 64));
      const bool fp8 = dt == DType::e4m3;
      HostTensor o_ref96(DType::bf16, o_ref.shape()), lse_ref96(DType::f32, lse_ref.shape());
      // fp8 without the LSE: O divided by the sums of the e4m3 P (the tensor cores' on sm_90a)
      HostTensor o_ref64_nolse(DType::bf16, o_ref.shape()), o_ref96_nolse(DType::bf16, o_ref.shape());
      if (fp8) {
        run_ref(k, variant_args(views(in.t), o_ref96.view(), lse_ref96.view(), nv.input ? &extra_view : nullptr, p.D),
                variant_config(192, 96));
        run_ref(k, variant_args(views(in.t), o_ref64_nolse.view(), lse_ref64.view(), nv.input ? &extra_view : nullptr, p.D, false),
                variant_config(64, 64));
        run_ref(k, variant_args(views(in.t), o_ref96_nolse.view(), lse_ref96.view(), nv.input ? &extra_view : nullptr, p.D, false),
                variant_config(192, 96));
      }
      const OnDevice dev = on_device(in.t);
      const std::vector<TensorView>& dv = dev.views;
      // 128 x 128 with and without block skipping (and a linear score hook's per-column terms);
      // 64 x 64 with a producer warp and no softmax / P.V overlap (fp8: three CTAs per SM, the
      // default for rows that see few keys) and fast math; fp8 192 x 96 in 4 stages with fast math
      // (the default for long rows, score hooks' too); fp8 both of those again without the LSE; 64 x 64
      // without the producer warp (attn_self_load: the consumers load K and V, walking the mask's list
      // of blocks ahead), with the LSE and (fp8) without
      const int first_self_load = fp8 ? 6 : 3;
      for (int run = 0; run < first_self_load + (fp8 ? 2 : 1); ++run) {
        const bool self_load = run >= first_self_load, skip = run != 1;
        const bool lean = self_load || run == 2 || run == 4, long_rows = !self_load && (run == 3 || run == 5);
        const bool with_lse = self_load ? run == first_self_load : run < 4;
        INFO(nv.variant.name << " " << name(dt) << " block skipping " << skip << " producer warp " << lean
                             << " 192 x 96 " << long_rows << " with_lse " << with_lse << " self_load " << self_load);
        DeviceTensor o(DType::bf16, o_ref.shape()), lse(DType::f32, lse_ref.shape());
        o.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        LaunchOptions lo;
        lo.config = lean ? variant_config(64, 64) : long_rows ? variant_config(192, 96) : variant_config(128, 128, skip);
        if (long_rows) {
          lo.config->num_stages = 4;
          lo.config->knobs["fast_math"] = 1;
        }
        // without block skipping, a linear score hook (ALiBi) also runs per element as score()
        if (!skip) lo.config->knobs["attn_linear_score"] = 0;
        if (lean) {
          lo.config->knobs["attn_lean_producer"] = 1;
          lo.config->knobs["attn_overlap"] = 0;
          lo.config->knobs["fast_math"] = 1;   // softcap's tanh as tanh.approx.f32 (its default config's)
        }
        if (self_load) lo.config->knobs["attn_self_load"] = 1;
        TensorView xv = extra_d.view();
        launch(k, variant_args(dv, o.view(), lse.view(), nv.input ? &xv : nullptr, p.D, with_lse), lo);
        runtime::synchronize();
        const HostTensor& o_want = !with_lse ? (lean ? o_ref64_nolse : o_ref96_nolse) : lean ? o_ref64 : long_rows ? o_ref96 : o_ref;
        const HostTensor& lse_want = lean ? lse_ref64 : long_rows ? lse_ref96 : lse_ref;
        Metrics mo = compare(o.to_host().values(), o_want.values());
        LseDiff ml = compare_lse(lse.to_host().values(), lse_want.values());
        MESSAGE(nv.variant.name << " " << name(dt) << " skip=" << skip << " lean=" << lean << " 192x96=" << long_rows
                                << " self_load=" << self_load << " GPU vs CPU reference: O " << str(mo) << "; LSE max abs " << ml.max_abs);
        CHECK(mo.nan == 0);
        CHECK(mo.rel_rmse <= 1e-2);
        if (!with_lse) continue;
        CHECK(ml.nan == 0);
        CHECK(ml.mismatched_inf == 0);
        CHECK(ml.max_abs <= 2e-3);
      }
    }
  }
}

TEST_CASE("gpu: attention variants that merge into their output match the CPU reference (bf16, f16, e4m3, O staged and stored per element, started early)") {
  TJ_REQUIRE_HOPPER();
  // Keys [0, 150) written, [150, 300) merged in, as dilated attention's pairs do (bf16, f16 and e4m3
  // inputs; O bf16, or f16 for f16 inputs), the second launch starting while the first ends
  // (LaunchOptions::start_early: it must wait for the first's O and LSE); o staged through
  // shared memory as 16-byte rows, or (a view whose rows are not 16-byte aligned) stored and read
  // back per element pair.
  std::mt19937 rng(76);
  const Problem p{2, 4, 4, 333, 300, 128};
  const int64_t split = 150;
  const Kernel first = kernels::attention_variant(keys_below(split));
  const Kernel second = kernels::attention_variant(keys_from_merging(split));
  HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng), kk = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng),
             v = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
  for (DType dt : {DType::bf16, DType::f16, DType::e4m3}) {
    const bool fp8 = is_fp8(dt);
    const DType out = dt == DType::f16 ? DType::f16 : DType::bf16;   // O in the inputs' 16-bit type
    KernelInputs in = kernel_inputs(dt, q, kk, v);
    const OnDevice dev = on_device(in.t);
    // bf16 128 x 128; fp8 64 x 128 with a producer warp and 3 of 8 exp2s in f16x2 pairs (dilated
    // attention's masked pairs' default), and 192 x 96; 64 x 128 (bf16 64 x 64) without the producer
    // warp, whose consumers read the running LSE themselves (attn_self_load: dilated attention's
    // default for its pairs without a mask)
    Config self_load = variant_config(64, fp8 ? 128 : 64);
    self_load.knobs = {{"attn_self_load", 1}, {"attn_overlap", 0}};
    if (fp8) self_load.knobs["attn_exp2_fma"] = 2;
    std::vector<Config> configs = {variant_config(128, 128), self_load};
    if (fp8) {
      Config lean = variant_config(64, 128);
      lean.knobs = {{"attn_lean_producer", 1}, {"attn_overlap", 0}, {"attn_exp2_fma", 3}};
      configs = {lean, variant_config(192, 96), self_load};
    }
    for (const Config& cfg : configs) {
      HostTensor o_ref(out, {p.B, p.H, p.Sq, p.D}), lse_ref(DType::f32, {p.B, p.H, p.Sq});
      run_ref(first, variant_args(views(in.t), o_ref.view(), lse_ref.view(), nullptr, p.D), cfg);
      run_ref(second, variant_args(views(in.t), o_ref.view(), lse_ref.view(), nullptr, p.D), cfg);
      for (bool staged : {true, false}) {
        INFO(name(dt) << " " << cfg.to_json() << " staged " << staged);
        // o inside a wider tensor: from column 1 of rows of D + 1 (2-byte aligned rows) when not staged
        DeviceTensor o_wide(out, {p.B, p.H, p.Sq, staged ? p.D : p.D + 1}), lse(DType::f32, lse_ref.shape());
        o_wide.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        TensorView o = o_wide.view();
        if (!staged) {
          o.strides = o.effective_strides();
          o.data = static_cast<char*>(o.data) + 2;
          o.shape.back() = p.D;
        }
        LaunchOptions lo;
        lo.config = cfg;
        launch(first, variant_args(dev.views, o, lse.view(), nullptr, p.D), lo);
        lo.start_early = true;
        launch(second, variant_args(dev.views, o, lse.view(), nullptr, p.D), lo);
        runtime::synchronize();
        const HostTensor wide = o_wide.to_host();
        std::vector<double> got(o_ref.numel());
        for (int64_t row = 0; row < p.B * p.H * p.Sq; ++row)
          for (int64_t d = 0; d < p.D; ++d) got[row * p.D + d] = wide.at(row * (staged ? p.D : p.D + 1) + (staged ? d : d + 1));
        Metrics mo = compare(got, o_ref.values());
        LseDiff ml = compare_lse(lse.to_host().values(), lse_ref.values());
        MESSAGE(name(dt) << " " << cfg.to_json() << std::string(staged ? " staged" : " per element")
                         << ": GPU vs CPU reference, O " << str(mo) << "; LSE max abs " << ml.max_abs);
        CHECK(mo.nan == 0);
        // fp8: the GPU's row sums come from the tensor cores (up to 3% off the reference's f32 sums
        // of the same e4m3 P in rows of few dominant keys), and the f16x2 exp2s
        CHECK(mo.rel_rmse <= (fp8 ? 1.5e-2 : 1e-2));
        CHECK(ml.nan == 0);
        CHECK(ml.mismatched_inf == 0);
        CHECK(ml.max_abs <= (fp8 ? 3e-2 : 2e-3));
      }
    }
  }
}

TEST_CASE("gpu: prefix-LM as the built-in causal mask with a prefix matches float64 (prefixes of none, past the tiles, past the keys)") {
  TJ_REQUIRE_HOPPER();
  // kv <= q || kv < prefix runs as the causal kernel with each row's last key max(q, prefix - 1):
  // prefixes of 0 (causal), 150 and 291 (past the first query tiles, not on a block boundary) and
  // 5000 (past every key: full attention), with more queries than keys.
  std::mt19937 rng(74);
  const Problem p{4, 2, 2, 333, 300, 128};
  const std::vector<int64_t> prefixes = {0, 150, 291, 5000};
  HostTensor prefix(DType::i64, {p.B});
  for (int64_t b = 0; b < p.B; ++b) prefix.set(b, static_cast<double>(prefixes[b]));
  const VariantMeaning meaning{.keep = [&](int64_t b, int64_t, int64_t i, int64_t j) { return j <= i || j < prefixes[b]; }};
  HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng), kk = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng),
             v = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
  DeviceTensor prefix_d = DeviceTensor::from_host(prefix);
  const TensorView pv = prefix_d.view();
  Kernel k = kernels::attention_variant(kernels::prefix_lm_variant());
  for (DType dt : {DType::bf16, DType::e4m3}) {
    KernelInputs in = kernel_inputs(dt, q, kk, v);
    const OnDevice dev = on_device(in.t);
    const std::vector<TensorView>& dv = dev.views;
    const std::vector<double> want = variant_f64(in.q64, in.k64, in.v64, meaning);
    std::vector<Config> configs = {variant_config(128, 128), variant_config(64, 64)};
    configs[1].knobs["attn_lean_producer"] = 1;
    configs[1].knobs["attn_overlap"] = 0;
    if (is_fp8(dt)) configs.push_back(variant_config(192, 96));
    for (const Config& cfg : configs) {
      INFO(name(dt) << " " << cfg.to_json());
      LaunchOptions lo;
      lo.config = cfg;
      DeviceTensor o(DType::bf16, {p.B, p.H, p.Sq, p.D}), lse(DType::f32, {p.B, p.H, p.Sq});
      o.fill_bytes(0xFF);
      lse.fill_bytes(0xFF);
      launch(k, variant_args(dv, o.view(), lse.view(), &pv, p.D), lo);
      runtime::synchronize();
      Metrics m = compare(o.to_host().values(), want);
      MESSAGE("prefix-LM " << name(dt) << " " << cfg.to_json() << " GPU vs float64: " << str(m));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= (is_fp8(dt) ? 4e-2 : 1e-2));
    }
  }
}

TEST_CASE("gpu: attention variants with more key blocks than the block table (entries of two blocks, self-loading kernels' of five) match float64") {
  TJ_REQUIRE_HOPPER();
  // 625 key blocks of 64 (the last one partial) for a table of 512 entries: each entry spans two
  // blocks and is classified as a whole. Cells of 96 keys straddle the entries' 128, so entries of
  // every class (skipped, kept whole, masked per element) occur.
  std::mt19937 rng(73);
  const Problem p{1, 2, 2, 150, 39963, 64};
  constexpr int64_t kCellQ = 64, kCellK = 96;
  const int64_t cells_q = (p.Sq + kCellQ - 1) / kCellQ, cells_k = (p.Skv + kCellK - 1) / kCellK;
  auto kept = [](int64_t h, int64_t qi, int64_t kj) { return kj == 3 * qi + h || (h * 5 + qi * 11 + kj * 7) % 9 < 2; };
  HostTensor cells(DType::i32, {1, p.H, cells_q, cells_k});
  for (int64_t h = 0; h < p.H; ++h)
    for (int64_t i = 0; i < cells_q; ++i)
      for (int64_t j = 0; j < cells_k; ++j) cells.set((h * cells_q + i) * cells_k + j, kept(h, i, j) ? 1.0 : 0.0);
  struct Case {
    kernels::AttentionVariant variant;
    VariantMeaning meaning;
    bool block_mask;
  };
  const std::vector<Case> cases = {
      {kernels::block_mask_variant(kCellQ, kCellK),
       {.keep = [&](int64_t, int64_t h, int64_t i, int64_t j) { return kept(h, i / kCellQ, j / kCellK); }},
       true},
      {kernels::segment_variant(5000), {.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return i / 5000 == j / 5000; }}, false},
  };
  HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng), kk = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng),
             v = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
  DeviceTensor cells_d = DeviceTensor::from_host(cells);
  // Both main-loop schedules walk the list: the overlapped one, and the simple one of a producer warp
  // (which looks up the next block while the S wgmma runs); and a self-loading kernel (attn_self_load),
  // whose table holds 128 entries (entries of five blocks here) and whose first thread walks it
  // kStages blocks ahead to load them.
  for (const Case& c : cases) {
    Kernel k = kernels::attention_variant(c.variant);
    for (const int schedule : {0, 1, 2}) {
      const bool lean = schedule >= 1, self_load = schedule == 2;
      for (DType dt : {DType::bf16, DType::e4m3}) {
        INFO(c.variant.name << " " << name(dt) << " producer warp, no overlap " << lean << " self-loading " << self_load);
        KernelInputs in = kernel_inputs(dt, q, kk, v);
        const OnDevice dev = on_device(in.t);
        const std::vector<TensorView>& dv = dev.views;
        DeviceTensor o(DType::bf16, {p.B, p.H, p.Sq, p.D}), lse(DType::f32, {p.B, p.H, p.Sq});
        o.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        LaunchOptions lo;
        lo.config = variant_config(64, 64);
        if (lean) {
          lo.config->knobs["attn_lean_producer"] = 1;
          lo.config->knobs["attn_overlap"] = 0;
        }
        if (self_load) lo.config->knobs["attn_self_load"] = 1;
        const TensorView cv = cells_d.view();
        launch(k, variant_args(dv, o.view(), lse.view(), c.block_mask ? &cv : nullptr, p.D), lo);
        runtime::synchronize();
        Metrics m = compare(o.to_host().values(), variant_f64(in.q64, in.k64, in.v64, c.meaning));
        MESSAGE(c.variant.name << " " << name(dt) << std::string(self_load ? " (self-loading)" : lean ? " (producer warp)" : "")
                               << " Skv " << p.Skv
                               << " GPU vs float64: " << str(m));
        CHECK(m.nan == 0);
        CHECK(m.rel_rmse <= (is_fp8(dt) ? 4e-2 : 1e-2));
      }
    }
  }
}

TEST_CASE("gpu: attention_fp8 and attention_fp8_merging with knob attn_persistent = 1 (CTAs looping over tiles) match one CTA per tile and float64") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(78);
  Config lean = variant_config(64, 128);
  lean.knobs = {{"attn_lean_producer", 1}, {"attn_overlap", 0}};
  Config tall = variant_config(192, 96);
  tall.num_stages = 4;
  const Config wide = variant_config(128, 128);
  auto persistent = [](Config c) {
    c.knobs["attn_persistent"] = 1;
    return c;
  };
  auto host_of = [](const DeviceTensor& t) { return t.to_host().values(); };
  struct Case {
    DType dt;
    Problem p;
    bool causal;
    Config cfg;
  };
  // More tiles than CTAs fit a 132-SM GPU at once (264 of 64 rows, 132 of 128 or 192), so that CTAs
  // loop; tails in the rows and the keys.
  const std::vector<Case> cases = {{DType::e4m3, {2, 16, 16, 600, 650, 128}, false, lean},
                                   {DType::e4m3, {2, 24, 24, 500, 500, 128}, true, tall},
                                   {DType::bf16, {2, 24, 24, 600, 600, 128}, false, wide},
                                   {DType::e4m3, {4, 16, 16, 333, 333, 64}, false, lean}};
  for (const Case& c : cases) {
    const Problem& p = c.p;
    HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng), kk = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng),
               v = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
    KernelInputs in = kernel_inputs(c.dt, q, kk, v);
    const OnDevice dev = on_device(in.t);
    VariantMeaning meaning;
    if (c.causal) meaning.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; };
    const std::vector<double> truth = variant_f64(in.q64, in.k64, in.v64, meaning);
    for (bool with_lse : {false, true}) {
      INFO(name(c.dt) << " " << c.cfg.to_json() << " causal " << c.causal << " with_lse " << with_lse);
      std::vector<double> o_of[2], lse_of[2];
      for (int pers = 0; pers < 2; ++pers) {
        DeviceTensor o(DType::bf16, {p.B, p.H, p.Sq, p.D}), lse(DType::f32, {p.B, p.H, p.Sq});
        o.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        std::vector<Arg> args = variant_args(dev.views, o.view(), lse.view(), nullptr, p.D, with_lse);
        args[10] = c.causal;
        LaunchOptions lo;
        lo.config = pers ? persistent(c.cfg) : c.cfg;
        launch(kernels::attention_fp8(), args, lo);
        runtime::synchronize();
        o_of[pers] = host_of(o);
        lse_of[pers] = host_of(lse);
      }
      // the same main loop and epilogue arithmetic: the same bits
      CHECK(o_of[1] == o_of[0]);
      if (with_lse) CHECK(lse_of[1] == lse_of[0]);
      const Metrics m = compare(o_of[1], truth);
      MESSAGE(name(c.dt) << " " << c.cfg.to_json() << " persistent, with_lse " << with_lse << ": vs float64 " << str(m));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= (is_fp8(c.dt) ? 5e-2 : 1e-2));
      CHECK(m.cosine >= (is_fp8(c.dt) ? 0.998 : 0.9999));
    }
  }

  // Merging (dilated attention's later pairs): keys [0, 300) then [300, 600) merged in by a launch
  // that starts early; the running LSE read per thread and the old O before the stores.
  const Problem p{2, 16, 16, 600, 300, 128};
  HostTensor q = randn(DType::bf16, {p.B, p.H, p.Sq, p.D}, rng);
  HostTensor k0 = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng), v0 = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
  HostTensor k1 = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng), v1 = randn(DType::bf16, {p.B, p.Hkv, p.Skv, p.D}, rng);
  for (DType dt : {DType::e4m3, DType::bf16}) {
    const Config cfg = is_fp8(dt) ? lean : wide;
    INFO("merging " << name(dt) << " " << cfg.to_json());
    KernelInputs in0 = kernel_inputs(dt, q, k0, v0), in1 = kernel_inputs(dt, q, k1, v1);
    const OnDevice dev0 = on_device(in0.t), dev1 = on_device(in1.t);
    // float64 over all 600 keys: K and V of the two halves one after the other
    auto joined = [&](const F64& a, const F64& b) {
      F64 r{{p.B, p.Hkv, 2 * p.Skv, p.D}, {}};
      for (int64_t bh = 0; bh < p.B * p.Hkv; ++bh) {
        r.v.insert(r.v.end(), a.v.begin() + bh * p.Skv * p.D, a.v.begin() + (bh + 1) * p.Skv * p.D);
        r.v.insert(r.v.end(), b.v.begin() + bh * p.Skv * p.D, b.v.begin() + (bh + 1) * p.Skv * p.D);
      }
      return r;
    };
    const std::vector<double> truth = variant_f64(in0.q64, joined(in0.k64, in1.k64), joined(in0.v64, in1.v64), {});
    std::vector<double> o_of[2];
    for (int pers = 0; pers < 2; ++pers) {
      DeviceTensor o(DType::bf16, {p.B, p.H, p.Sq, p.D}), lse(DType::f32, {p.B, p.H, p.Sq});
      o.fill_bytes(0xFF);
      lse.fill_bytes(0xFF);
      LaunchOptions lo;
      lo.config = pers ? persistent(cfg) : cfg;
      launch(kernels::attention_fp8(), variant_args(dev0.views, o.view(), lse.view(), nullptr, p.D), lo);
      lo.start_early = true;
      launch(kernels::attention_fp8_merging(), variant_args(dev1.views, o.view(), lse.view(), nullptr, p.D), lo);
      runtime::synchronize();
      o_of[pers] = host_of(o);
    }
    // merged in f32 from registers (persistent) or from the O staged as bf16: a rounding apart
    const Metrics between = compare(o_of[1], o_of[0]);
    const Metrics m = compare(o_of[1], truth);
    MESSAGE("merging " << name(dt) << " persistent: vs one CTA per tile " << str(between) << "; vs float64 " << str(m));
    CHECK(between.nan == 0);
    CHECK(between.rel_rmse <= 5e-3);
    CHECK(m.rel_rmse <= (is_fp8(dt) ? 5e-2 : 1e-2));
    CHECK(m.cosine >= (is_fp8(dt) ? 0.998 : 0.9999));
  }
}
