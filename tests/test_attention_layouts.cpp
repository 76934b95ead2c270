// attention_fp8_forward on the inputs models hand it: grouped-query heads (H a multiple of Hkv) in
// 16-bit and through the FP8 pipeline, and Q / K / V / O stored [B, S, H, D] or packed as one
// [B, S, 3, H, D] QKV tensor, passed as strided [B, H, S, D] views (no copy).
//
// CPU (CI): the shape errors. GPU (TJ_REQUIRE_HOPPER): each case against float64 attention.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "attention_accuracy.h"
#include "gpu.h"
#include "kernels/attention_fp8.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;
using tj_test::compare;
using tj_test::gqa_attention_f64;
using tj_test::Metrics;
using tj_test::randn;
using tj_test::str;
using tj_test::unbacked_device_view;

namespace {

enum class Layout { bhsd, bshd, packed_qkv };
const char* name(Layout l) { return l == Layout::bhsd ? "BHSD" : l == Layout::bshd ? "BSHD" : "packed QKV"; }

// Device storage of logical [B, H, S, D] tensors in a layout, and [B, H, S, D] views of it.
struct Stored {
  std::vector<DeviceTensor> buffers;
  std::vector<TensorView> views;
};
// q, k, v in `layout` (packed QKV: one [B, S, 3, H, D] tensor, so H == Hkv).
Stored store(Layout layout, const std::vector<const HostTensor*>& xs) {
  Stored st;
  if (layout == Layout::bhsd) {
    for (const HostTensor* x : xs) st.buffers.push_back(DeviceTensor::from_host(*x));
    for (const auto& b : st.buffers) st.views.push_back(b.view());
  } else if (layout == Layout::bshd) {
    for (const HostTensor* x : xs) st.buffers.push_back(DeviceTensor::from_host(tj_test::swap_dims_1_2(*x)));
    for (const auto& b : st.buffers) st.views.push_back(tj_test::bshd_view(b));
  } else {
    const auto& s = xs[0]->shape();
    const int64_t B = s[0], H = s[1], S = s[2], D = s[3];
    HostTensor packed(xs[0]->dtype(), {B, S, 3, H, D});
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t r = 0; r < S; ++r)
            for (int64_t d = 0; d < D; ++d)
              packed.set((((b * S + r) * 3 + i) * H + h) * D + d, xs[i]->at(((b * H + h) * S + r) * D + d));
    st.buffers.push_back(DeviceTensor::from_host(packed));
    for (int64_t i = 0; i < 3; ++i) {
      TensorView v = st.buffers[0].view();
      v.data = static_cast<char*>(v.data) + i * H * D * size_bytes(v.dtype);
      v.shape = {B, H, S, D};
      v.strides = {S * 3 * H * D, D, 3 * H * D, 1};
      st.views.push_back(v);
    }
  }
  return st;
}

}  // namespace

TEST_CASE("attention_fp8_forward: q's heads must be a multiple of k's and v's") {
  auto q = unbacked_device_view(DType::bf16, {1, 6, 64, 64});
  auto kv = unbacked_device_view(DType::bf16, {1, 4, 64, 64});
  kernels::AttentionFp8Workspace ws;
  kernels::AttentionFp8Options opt;
  CHECK_THROWS_WITH_AS(kernels::attention_fp8_forward(q, kv, kv, q, opt, ws),
                       doctest::Contains("q's 6 heads are not a multiple of k's and v's 4 (grouped-query attention: query "
                                         "head h reads kv head h / (H / Hkv))"),
                       Error);
}

TEST_CASE("gpu: attention_fp8_forward on grouped-query heads and [B, S, H, D] / packed QKV views vs float64 (bf16, FP8)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(43);
  struct Case {
    int64_t H, Hkv;
    Layout layout;
    bool causal;
  };
  const int64_t B = 2, S = 300, D = 128;
  for (const Case& c : {Case{8, 8, Layout::bhsd, false}, Case{8, 2, Layout::bhsd, true}, Case{8, 1, Layout::bhsd, false},
                        Case{8, 2, Layout::bshd, false}, Case{8, 8, Layout::bshd, true}, Case{4, 4, Layout::packed_qkv, true}})
    for (bool fp8 : {false, true}) {
      const std::string what =
          fmt::format("H {} Hkv {} {} {} {}", c.H, c.Hkv, name(c.layout), c.causal ? "causal" : "non-causal", fp8 ? "fp8" : "bf16");
      INFO(what);
      const HostTensor q = randn(DType::bf16, {B, c.H, S, D}, rng), k = randn(DType::bf16, {B, c.Hkv, S, D}, rng),
                       v = randn(DType::bf16, {B, c.Hkv, S, D}, rng);
      const std::vector<double> truth = gqa_attention_f64(q, k, v, c.causal);
      Stored in = store(c.layout, {&q, &k, &v});
      // O in the inputs' layout (packed QKV: BSHD), poisoned.
      DeviceTensor o_buf(DType::bf16, c.layout == Layout::bhsd ? std::vector<int64_t>{B, c.H, S, D} : std::vector<int64_t>{B, S, c.H, D});
      o_buf.fill_bytes(0xFF);
      const TensorView o = c.layout == Layout::bhsd ? o_buf.view() : tj_test::bshd_view(o_buf);
      kernels::AttentionFp8Options opt;
      opt.causal = c.causal;
      opt.quantize = fp8;
      kernels::AttentionFp8Workspace ws;
      kernels::attention_fp8_forward(in.views[0], in.views[1], in.views[2], o, opt, ws);
      runtime::synchronize();
      HostTensor got = o_buf.to_host();
      if (c.layout != Layout::bhsd) got = tj_test::swap_dims_1_2(got);   // back to [B, H, S, D] order
      const Metrics m = compare(got.values(), truth);
      MESSAGE(what << " vs float64: " << str(m));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= (fp8 ? 6.5e-2 : 1e-2));
      if (fp8) CHECK(m.cosine >= 0.998);
    }
}
