// The C API (api/tilejit_c.h): its argument errors as statuses with a message (CPU), and on the
// GPU the same output as kernels::attention_fp8_forward for strided views and a variant.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "api/tilejit_c.h"
#include "attention_accuracy.h"
#include "backward_testing.h"
#include "gpu.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variant.h"
#include "kernels/attention_variants.h"
#include "kernels/attention_varlen.h"
#include "kernels/fp8_linear.h"
#include "runtime/owned_tensor.h"

using namespace tj;

namespace {

struct CTensor {
  std::vector<int64_t> shape, strides;
  tj_tensor t{};
  CTensor(void* data, int32_t dtype, std::vector<int64_t> s, std::vector<int64_t> st = {}) : shape(std::move(s)), strides(std::move(st)) {
    t = tj_tensor{data, dtype, static_cast<int32_t>(shape.size()), shape.data(), strides.empty() ? nullptr : strides.data()};
  }
};

std::string last_error() { return tj_last_error(); }

}  // namespace

TEST_CASE("C API: bad arguments are statuses with a message naming the argument") {
  void* fake = reinterpret_cast<void*>(0x100000);
  CTensor q(fake, TJ_BF16, {1, 2, 64, 64}), f32(fake, TJ_F32, {1, 2, 64, 64}), odd(fake, 42, {1, 2, 64, 64}),
      neg(fake, TJ_BF16, {1, -2, 64, 64}), f16(fake, TJ_F16, {1, 2, 64, 64});
  CHECK(tj_attention_forward(nullptr, nullptr, &q.t, &q.t, &q.t, nullptr, nullptr) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "tj_attention_forward: q is NULL");
  CHECK(tj_attention_forward(nullptr, &f32.t, &q.t, &q.t, &q.t, nullptr, nullptr) == TJ_ERROR_DTYPE);
  CHECK(last_error().find("q, k and v must be bf16 or f16 (fp8 = 1 quantizes them), got f32[1, 2, 64, 64]") != std::string::npos);
  CHECK(tj_attention_forward(nullptr, &q.t, &odd.t, &q.t, &q.t, nullptr, nullptr) == TJ_ERROR_DTYPE);
  CHECK(last_error() == "tj_attention_forward: k: unknown tj_dtype 42");
  CHECK(tj_attention_forward(nullptr, &q.t, &neg.t, &q.t, &q.t, nullptr, nullptr) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("k: negative dim") != std::string::npos);
  CHECK(tj_attention_forward(nullptr, &q.t, &q.t, &q.t, &f16.t, nullptr, nullptr) == TJ_ERROR_DTYPE);
  CHECK(last_error().find("q, k, v and o must share one type") != std::string::npos);
  tj_attention_options opt{0, 0, 0.0, "flash", 0.0};
  CHECK(tj_attention_forward(nullptr, &q.t, &q.t, &q.t, &q.t, nullptr, &opt) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("no attention variant named 'flash' (variants: sliding_window, softcap, alibi)") != std::string::npos);
  opt.variant = "sliding_window";
  opt.variant_arg = 0.5;
  CHECK(tj_attention_forward(nullptr, &q.t, &q.t, &q.t, &q.t, nullptr, &opt) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("variant sliding_window: variant_arg 0.5 is not a window of >= 1 keys") != std::string::npos);
  opt = tj_attention_options{0, 0, NAN, nullptr, 0.0};
  CHECK(tj_attention_forward(nullptr, &q.t, &q.t, &q.t, &q.t, nullptr, &opt) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("softmax_scale nan is not finite") != std::string::npos);
  // Varlen: packed [T, heads, D] and cu_seqlens; no variant.
  CTensor pq(fake, TJ_BF16, {577, 4, 128}), pkv(fake, TJ_BF16, {577, 2, 128}), cu(fake, TJ_I32, {4}), cuf(fake, TJ_F32, {4});
  CHECK(tj_attention_varlen_forward(nullptr, &pq.t, &pkv.t, &pkv.t, nullptr, &pq.t, nullptr, nullptr) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "tj_attention_varlen_forward: cu_seqlens is NULL");
  CHECK(tj_attention_varlen_forward(nullptr, &pq.t, &pkv.t, &pkv.t, &cuf.t, &pq.t, nullptr, nullptr) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("cu_seqlens is i32 or i64 [N + 1] (N >= 1 sequences), got f32[4]") != std::string::npos);
  CHECK(tj_attention_varlen_forward(nullptr, &q.t, &q.t, &q.t, &cu.t, &q.t, nullptr, nullptr) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("q, k, v and o are packed [T, heads, D]") != std::string::npos);
  tj_attention_options alibi{0, 0, 0.0, "alibi", 0.0};
  CHECK(tj_attention_varlen_forward(nullptr, &pq.t, &pkv.t, &pkv.t, &cu.t, &pq.t, nullptr, &alibi) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("variant 'alibi': varlen attention takes none") != std::string::npos);
  // Backward: the 16-bit attention's, without a variant.
  CTensor lse(fake, TJ_F32, {1, 2, 64});
  tj_attention_options fp8{0, 1, 0.0, nullptr, 0.0}, window{1, 0, 0.0, "sliding_window", 8.0};
  CHECK(tj_attention_backward(nullptr, &f32.t, &q.t, &q.t, &q.t, &q.t, &lse.t, &q.t, &q.t, &q.t, &fp8) == TJ_ERROR_DTYPE);
  CHECK(last_error().find("q, k and v must be bf16 or f16") != std::string::npos);
  // The FP8 linear layer.
  CTensor x(fake, TJ_BF16, {64, 96}), w(fake, TJ_BF16, {32, 96}), y(fake, TJ_BF16, {64, 32}), wbad(fake, TJ_BF16, {32, 80});
  CHECK(tj_fp8_linear_forward(nullptr, &x.t, nullptr, nullptr, &y.t) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "tj_fp8_linear_forward: w is NULL");
  CHECK(tj_fp8_linear_forward(nullptr, &x.t, &wbad.t, nullptr, &y.t) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("tj_fp8_linear_forward: fp8_linear") != std::string::npos);
  CHECK(tj_fp8_linear_backward(nullptr, &y.t, &x.t, &w.t, nullptr, &w.t) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "tj_fp8_linear_backward: dx is NULL");
  // A variant's backward is the 16-bit one; the names are the forward's.
  tj_attention_options window_fp8 = window, unknown{1, 0, 0.0, "sliding_windw", 8.0};
  window_fp8.fp8 = 1;
  CHECK(tj_attention_backward(nullptr, &q.t, &q.t, &q.t, &q.t, &q.t, &lse.t, &q.t, &q.t, &q.t, &window_fp8) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("variant 'sliding_window': the FP8 backward takes no variant yet") != std::string::npos);
  CHECK(tj_attention_backward(nullptr, &q.t, &q.t, &q.t, &q.t, &q.t, &lse.t, &q.t, &q.t, &q.t, &unknown) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("no attention variant named 'sliding_windw' (variants: sliding_window, softcap, alibi)") != std::string::npos);
  CHECK(tj_attention_backward(nullptr, &q.t, &q.t, &q.t, &q.t, nullptr, &lse.t, &q.t, &q.t, &q.t, nullptr) == TJ_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "tj_attention_backward: dout is NULL");
  CHECK(tj_attention_backward(nullptr, &f32.t, &q.t, &q.t, &q.t, &q.t, &lse.t, &q.t, &q.t, &q.t, nullptr) == TJ_ERROR_DTYPE);
  CHECK(last_error().find("q, k and v must be bf16 or f16") != std::string::npos);
  CHECK(std::string(tj_status_message(TJ_ERROR_ALIGNMENT)).find("not aligned") != std::string::npos);
  CHECK(tj_device_ordinal() >= 0);
}

TEST_CASE("gpu: C API attention on [B, S, H, D] views (plain and sliding window) writes what attention_fp8_forward writes") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(7);
  const int64_t B = 2, S = 300, H = 4, Hkv = 2, D = 64;
  // [B, S, H, D] storage seen as [B, H, S, D]
  HostTensor q = tj_test::randn(DType::bf16, {B, S, H, D}, rng), k = tj_test::randn(DType::bf16, {B, S, Hkv, D}, rng),
             v = tj_test::randn(DType::bf16, {B, S, Hkv, D}, rng);
  DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v);
  DeviceTensor o1(DType::bf16, {B, S, H, D}), o2(DType::bf16, {B, S, H, D});
  const std::vector<int64_t> qs{S * H * D, D, H * D, 1}, ks{S * Hkv * D, D, Hkv * D, 1};
  CTensor cq(dq.view().data, TJ_BF16, {B, H, S, D}, qs), ck(dk.view().data, TJ_BF16, {B, Hkv, S, D}, ks),
      cv(dv.view().data, TJ_BF16, {B, Hkv, S, D}, ks), co(o1.view().data, TJ_BF16, {B, H, S, D}, qs);
  for (const char* variant : {"", "sliding_window"}) {
    INFO(variant);
    o1.fill_bytes(0xFF);
    o2.fill_bytes(0x00);
    tj_attention_options opt{1, 0, 0.0, variant, 100.0};
    REQUIRE_MESSAGE(tj_attention_forward(nullptr, &cq.t, &ck.t, &cv.t, &co.t, nullptr, &opt) == TJ_SUCCESS, last_error());
    kernels::AttentionFp8Options fo;
    fo.quantize = false;   // the C API's fp8 = 0: the 16-bit attention
    kernels::AttentionFp8Workspace ws;
    std::optional<Kernel> window;
    if (*variant) {
      window.emplace(kernels::attention_variant(kernels::sliding_window_variant(100)));
      fo.kernel = &*window;
    } else {
      fo.causal = true;
    }
    kernels::attention_fp8_forward(tj_test::bshd_view(dq), tj_test::bshd_view(dk), tj_test::bshd_view(dv),
                                   tj_test::bshd_view(o2), fo, ws);
    runtime::synchronize();
    HostTensor a = o1.to_host(), b = o2.to_host();
    if (!*variant) {   // against float64 too (logical [B, H, S, D] values)
      using tj_test::swap_dims_1_2;
      const auto m = tj_test::compare(swap_dims_1_2(a).values(),
                                      tj_test::gqa_attention_f64(swap_dims_1_2(q), swap_dims_1_2(k), swap_dims_1_2(v), true));
      MESSAGE("C API, bf16 [B, S, H, D] GQA causal, vs float64: " << tj_test::str(m));
      CHECK(m.rel_rmse <= 1e-2);
    }
    CHECK(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
    int64_t nan = 0;
    for (double x : a.values()) nan += std::isnan(x) ? 1 : 0;
    CHECK(nan == 0);
  }
}

TEST_CASE("gpu: C API varlen attention writes what attention_varlen_forward writes (bf16, causal, GQA)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(9);
  const std::vector<double> cu = {0, 200, 277, 577};
  const int64_t T = 577, H = 4, Hkv = 2, D = 128;
  HostTensor q = tj_test::randn(DType::bf16, {T, H, D}, rng), k = tj_test::randn(DType::bf16, {T, Hkv, D}, rng),
             v = tj_test::randn(DType::bf16, {T, Hkv, D}, rng);
  DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v);
  DeviceTensor dcu = DeviceTensor::from_host(HostTensor::from_values(cu, DType::i64, {4}));
  DeviceTensor o1(DType::bf16, {T, H, D}), o2(DType::bf16, {T, H, D});
  o1.fill_bytes(0xFF);
  o2.fill_bytes(0x00);
  CTensor cq(dq.view().data, TJ_BF16, {T, H, D}), ck(dk.view().data, TJ_BF16, {T, Hkv, D}), cv(dv.view().data, TJ_BF16, {T, Hkv, D}),
      ccu(dcu.view().data, TJ_I64, {4}), co(o1.view().data, TJ_BF16, {T, H, D});
  tj_attention_options opt{1, 0, 0.0, nullptr, 0.0};
  REQUIRE_MESSAGE(tj_attention_varlen_forward(nullptr, &cq.t, &ck.t, &cv.t, &ccu.t, &co.t, nullptr, &opt) == TJ_SUCCESS, last_error());
  kernels::AttentionVarlenOptions vo;
  vo.attention.causal = true;
  vo.attention.quantize = false;   // the C API's fp8 = 0
  kernels::AttentionFp8Workspace ws;
  kernels::attention_varlen_forward(dq.view(), dk.view(), dv.view(), dcu.view(), o2.view(), vo, ws);
  runtime::synchronize();
  HostTensor a = o1.to_host(), b = o2.to_host();
  CHECK(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

TEST_CASE("gpu: C API backward on [B, S, H, D] views (grouped-query heads, causal and not, bf16 and fp8) matches float64 and "
          "attention_backward") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(11);
  const int64_t B = 1, S = 320, H = 4, Hkv = 2, D = 128;
  const std::vector<int64_t> qs{S * H * D, D, H * D, 1}, ks{S * Hkv * D, D, Hkv * D, 1};
  for (bool fp8 : {false, true})
  for (bool causal : {false, true}) {
    INFO("causal " << causal << " fp8 " << fp8);
    // [B, S, H, D] storage seen as [B, H, S, D], gradients in the same layouts.
    const HostTensor q = tj_test::randn(DType::bf16, {B, S, H, D}, rng), k = tj_test::randn(DType::bf16, {B, S, Hkv, D}, rng),
                     v = tj_test::randn(DType::bf16, {B, S, Hkv, D}, rng), dout = tj_test::randn(DType::bf16, {B, S, H, D}, rng);
    const DeviceTensor gq = DeviceTensor::from_host(q), gk = DeviceTensor::from_host(k), gv = DeviceTensor::from_host(v),
                       gdo = DeviceTensor::from_host(dout);
    DeviceTensor o(DType::bf16, {B, S, H, D}), lse(DType::f32, {B, H, S});
    DeviceTensor dq(DType::bf16, {B, S, H, D}), dk(DType::bf16, {B, S, Hkv, D}), dv(DType::bf16, {B, S, Hkv, D});
    DeviceTensor dq2(DType::bf16, {B, S, H, D}), dk2(DType::bf16, {B, S, Hkv, D}), dv2(DType::bf16, {B, S, Hkv, D});
    for (DeviceTensor* t : {&dq, &dk, &dv}) t->fill_bytes(0xFF);
    auto c = [](const DeviceTensor& t, const std::vector<int64_t>& strides) {
      const auto& s = t.view().shape;
      return CTensor(t.view().data, TJ_BF16, {s[0], s[2], s[1], s[3]}, strides);
    };
    CTensor cq = c(gq, qs), ck = c(gk, ks), cv = c(gv, ks), co = c(o, qs), cdo = c(gdo, qs), cdq = c(dq, qs), cdk = c(dk, ks),
            cdv = c(dv, ks), clse(lse.view().data, TJ_F32, {B, H, S});
    const tj_attention_options opt{causal ? 1 : 0, fp8 ? 1 : 0, 0.0, nullptr, 0.0};
    REQUIRE_MESSAGE(tj_attention_forward(nullptr, &cq.t, &ck.t, &cv.t, &co.t, &clse.t, &opt) == TJ_SUCCESS, last_error());
    REQUIRE_MESSAGE(tj_attention_backward(nullptr, &cq.t, &ck.t, &cv.t, &co.t, &cdo.t, &clse.t, &cdq.t, &cdk.t, &cdv.t, &opt) ==
                        TJ_SUCCESS,
                    last_error());
    kernels::AttentionBackwardOptions bo;
    bo.causal = causal;
    bo.fp8 = fp8;
    kernels::AttentionBackwardWorkspace ws;
    using tj_test::bshd_view;
    kernels::attention_backward(bshd_view(gq), bshd_view(gk), bshd_view(gv), bshd_view(o), bshd_view(gdo), lse.view(), bshd_view(dq2),
                                bshd_view(dk2), bshd_view(dv2), bo, ws);
    runtime::synchronize();
    std::vector<double> o64, lse64;
    tj_test::Grads want;
    using tj_test::swap_dims_1_2;
    tj_test::reference_attention(swap_dims_1_2(q), swap_dims_1_2(k), swap_dims_1_2(v), swap_dims_1_2(dout), causal,
                                 1.0 / std::sqrt(static_cast<double>(D)), o64, lse64, want);
    const std::pair<const DeviceTensor*, const DeviceTensor*> pairs[] = {{&dq, &dq2}, {&dk, &dk2}, {&dv, &dv2}};
    const std::vector<double>* refs[] = {&want.dq, &want.dk, &want.dv};
    const char* names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i) {
      const HostTensor a = pairs[i].first->to_host(), b = pairs[i].second->to_host();
      const auto m = tj_test::compare(swap_dims_1_2(a).values(), *refs[i]);
      MESSAGE("C API backward, " << std::string(fp8 ? "fp8" : "bf16") << " [B, S, H, D] GQA, " << std::string(names[i])
                                  << " vs float64: " << tj_test::str(m));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= (fp8 ? 0.12 : 3e-2));   // fp8: the recipe's own error, 5-8e-2 (docs/numerics.md)
      CHECK(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);   // the library's call on the same views
    }
  }
}

TEST_CASE("gpu: C API fp8 linear forward and backward write what fp8_linear_forward / _backward write") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(12);
  const int64_t M = 256, N = 192, K = 320;
  const DeviceTensor x = DeviceTensor::from_host(tj_test::randn(DType::bf16, {M, K}, rng)),
                     w = DeviceTensor::from_host(tj_test::randn(DType::bf16, {N, K}, rng)),
                     b = DeviceTensor::from_host(tj_test::randn(DType::bf16, {N}, rng)),
                     dy = DeviceTensor::from_host(tj_test::randn(DType::bf16, {M, N}, rng));
  DeviceTensor y1(DType::bf16, {M, N}), y2(DType::bf16, {M, N}), dx1(DType::bf16, {M, K}), dx2(DType::bf16, {M, K}),
      dw1(DType::f32, {N, K}), dw2(DType::f32, {N, K});
  for (DeviceTensor* t : {&y1, &dx1, &dw1}) t->fill_bytes(0xFF);
  auto c = [](const DeviceTensor& t, int32_t dtype) { return CTensor(t.view().data, dtype, t.view().shape); };
  CTensor cx = c(x, TJ_BF16), cw = c(w, TJ_BF16), cb = c(b, TJ_BF16), cdy = c(dy, TJ_BF16), cy = c(y1, TJ_BF16), cdx = c(dx1, TJ_BF16),
          cdw = c(dw1, TJ_F32);
  REQUIRE_MESSAGE(tj_fp8_linear_forward(nullptr, &cx.t, &cw.t, &cb.t, &cy.t) == TJ_SUCCESS, last_error());
  REQUIRE_MESSAGE(tj_fp8_linear_backward(nullptr, &cdy.t, &cx.t, &cw.t, &cdx.t, &cdw.t) == TJ_SUCCESS, last_error());
  kernels::Fp8LinearState state;
  kernels::fp8_linear_forward(x.view(), w.view(), b.view(), y2.view(), {}, state);
  kernels::fp8_linear_backward(dy.view(), x.view(), w.view(), dx2.view(), dw2.view(), {}, state);
  runtime::synchronize();
  for (const auto& [p, q] : {std::pair{&y1, &y2}, std::pair{&dx1, &dx2}, std::pair{&dw1, &dw2}}) {
    const HostTensor a = p->to_host(), bb = q->to_host();
    CHECK(std::memcmp(a.data(), bb.data(), a.size_bytes()) == 0);
    for (int64_t i = 0; i < a.numel(); ++i) REQUIRE(std::isfinite(a.at(i)));
  }
}
