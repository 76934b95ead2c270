// Dilated attention (kernels/dilated_attention.h) against a float64 LongNet reference.
// CPU (CI): errors for pairs that do not fit. (The mix itself, attention variants that merge into
// their output, is tested on the CPU reference in test_attention_variants.cpp.)
// CPU: whole segments as heads (dilated_segments_as_heads), element by element.
// GPU (TJ_REQUIRE_GPU): dilated_attention_forward in bf16 and FP8, several (w, r) pairs mixed,
// with and without a pair of rate 1, causal and not, a length that is not a multiple of the
// segments.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attention_accuracy.h"
#include "backward_testing.h"
#include "gpu.h"
#include "kernels/dilated_attention.h"
#include "runtime/device.h"
#include "autotune/launch.h"
#include "runtime/jit.h"

using namespace tj;
using namespace tj_test;

namespace {

struct PartResult {
  std::vector<double> o, lse;   // [B, H, S, D], [B, H, S] (-inf where the pair does not cover)
};

// One pair of LongNet in float64: heads h use offset h mod r; rows j + t r of each segment.
PartResult dilated_pair_f64(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                            int64_t B, int64_t H, int64_t S, int64_t D, kernels::DilatedPair pr, bool causal) {
  PartResult r{std::vector<double>(B * H * S * D, 0.0), std::vector<double>(B * H * S, -INFINITY)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t j = (bh % H) % pr.rate;
    for (int64_t seg = 0; seg < S; seg += pr.segment) {
      std::vector<int64_t> rows;
      for (int64_t s = seg + j; s < std::min(S, seg + pr.segment); s += pr.rate) rows.push_back(s);
      for (size_t a = 0; a < rows.size(); ++a) {
        const double* Q = &q[(bh * S + rows[a]) * D];
        std::vector<double> sc;
        double mx = -INFINITY;
        const size_t n = causal ? a + 1 : rows.size();
        for (size_t c = 0; c < n; ++c) {
          double d = 0;
          for (int64_t t = 0; t < D; ++t) d += Q[t] * k[(bh * S + rows[c]) * D + t];
          sc.push_back(d * scale);
          mx = std::max(mx, d * scale);
        }
        double l = 0;
        double* O = &r.o[(bh * S + rows[a]) * D];
        for (size_t c = 0; c < n; ++c) {
          const double p = std::exp(sc[c] - mx);
          l += p;
          for (int64_t t = 0; t < D; ++t) O[t] += p * v[(bh * S + rows[c]) * D + t];
        }
        for (int64_t t = 0; t < D; ++t) O[t] /= l;
        r.lse[bh * S + rows[a]] = mx + std::log(l);
      }
    }
  }
  return r;
}

// The pairs mixed with weights exp(lse_p) (softmax over the union of their keys).
std::vector<double> mix_f64(const std::vector<PartResult>& parts, int64_t rows, int64_t D) {
  std::vector<double> out(rows * D, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double top = -INFINITY;
    for (const auto& p : parts) top = std::max(top, p.lse[i]);
    if (top == -INFINITY) continue;
    double den = 0;
    for (const auto& p : parts) den += std::exp(p.lse[i] - top);
    for (const auto& p : parts) {
      const double w = std::exp(p.lse[i] - top) / den;
      if (w > 0)
        for (int64_t t = 0; t < D; ++t) out[i * D + t] += w * p.o[i * D + t];
    }
  }
  return out;
}

// Dilated attention as softmax over every pair's keys of a row at once (a key two pairs share
// counts twice, as the mix by logsumexps counts it), in float64: o, lse (natural; -inf for a row no
// pair covers) and the gradients of sum(dout * o).
struct DilatedF64 {
  std::vector<double> o, lse, dq, dk, dv;
};
DilatedF64 dilated_f64(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& dout,
                       const std::vector<kernels::DilatedPair>& pairs, bool causal) {
  const auto& sh = q.shape();
  const int64_t B = sh[0], H = sh[1], S = sh[2], D = sh[3];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  DilatedF64 r{std::vector<double>(B * H * S * D, 0.0), std::vector<double>(B * H * S, -INFINITY), std::vector<double>(B * H * S * D, 0.0),
               std::vector<double>(B * H * S * D, 0.0), std::vector<double>(B * H * S * D, 0.0)};
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t h = bh % H, base = bh * S * D;
    for (int64_t i = 0; i < S; ++i) {
      std::vector<int64_t> keys;   // every pair's keys of row i, repeated where pairs share one
      for (const auto& [w, rate] : pairs) {
        const int64_t off = h % rate;
        if (i < off || (i - off) % rate != 0) continue;
        for (int64_t j = i / w * w + off; j < std::min(S, i / w * w + w); j += rate)
          if (!causal || j <= i) keys.push_back(j);
      }
      if (keys.empty()) continue;
      std::vector<double> s(keys.size()), dp(keys.size());
      double mx = -INFINITY;
      for (size_t a = 0; a < keys.size(); ++a) {
        double d = 0, e = 0;
        for (int64_t t = 0; t < D; ++t) {
          d += q.at(base + i * D + t) * k.at(base + keys[a] * D + t);
          e += dout.at(base + i * D + t) * v.at(base + keys[a] * D + t);
        }
        s[a] = d * scale;
        dp[a] = e;
        mx = std::max(mx, s[a]);
      }
      double l = 0;
      for (double x : s) l += std::exp(x - mx);
      const double lse = mx + std::log(l);
      r.lse[bh * S + i] = lse;
      double delta = 0;
      for (int64_t t = 0; t < D; ++t) {
        double acc = 0;
        for (size_t a = 0; a < keys.size(); ++a) acc += std::exp(s[a] - lse) * v.at(base + keys[a] * D + t);
        r.o[base + i * D + t] = acc;
        delta += dout.at(base + i * D + t) * acc;
      }
      for (size_t a = 0; a < keys.size(); ++a) {
        const double p = std::exp(s[a] - lse), ds = p * (dp[a] - delta);
        for (int64_t t = 0; t < D; ++t) {
          r.dq[base + i * D + t] += scale * ds * k.at(base + keys[a] * D + t);
          r.dk[base + keys[a] * D + t] += scale * ds * q.at(base + i * D + t);
          r.dv[base + keys[a] * D + t] += p * dout.at(base + i * D + t);
        }
      }
    }
  }
  return r;
}

}  // namespace

TEST_CASE("dilated attention backward on the CPU reference: float64 gradients of the pairs' mix (shared keys, rows no pair "
          "covers, a last segment cut short, causal and not)") {
  std::mt19937 rng(86);
  const int64_t H = 4, S = 96, D = 32;
  const std::vector<int64_t> shape = {1, H, S, D}, rows = {1, H, S}, sums = {3, 1, H, S, D};
  const std::vector<std::vector<kernels::DilatedPair>> pair_sets = {{{16, 1}, {32, 2}, {64, 4}}, {{32, 2}, {64, 4}}};
  for (const auto& pairs : pair_sets)
    for (bool causal : {false, true}) {
      INFO("pairs " << pairs.size() << " causal " << causal);
      const HostTensor q = randn(DType::bf16, shape, rng), k = randn(DType::bf16, shape, rng), v = randn(DType::bf16, shape, rng),
                       dout = randn(DType::bf16, shape, rng);
      const DilatedF64 want = dilated_f64(q, k, v, dout, pairs, causal);
      const HostTensor o = HostTensor::from_values(want.o, DType::bf16, shape), lse = HostTensor::from_values(want.lse, DType::f32, rows);
      HostTensor dq(DType::f32, shape), dk(DType::bf16, shape), dv(DType::f32, shape), delta(DType::f32, rows), lse2(DType::f32, rows),
          acc(DType::f32, sums), part(DType::f32, sums);
      for (HostTensor* t : {&dq, &dk, &dv, &delta, &lse2, &acc, &part}) t->fill_bytes(0xFF);   // poison
      kernels::DilatedOptions opt;
      opt.pairs = pairs;
      opt.causal = causal;
      tj_test::run_launches(kernels::dilated_backward_launches(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), dq.view(),
                                                               dk.view(), dv.view(), opt, delta.view(), lse2.view(), acc.view(),
                                                               part.view()));
      const Metrics mq = compare(dq.values(), want.dq), mk = compare(dk.values(), want.dk), mv = compare(dv.values(), want.dv);
      MESSAGE("dilated backward vs float64: dq ", str(mq), "; dk ", str(mk), "; dv ", str(mv));
      CHECK(mq.nan + mk.nan + mv.nan == 0);
      CHECK(mq.rel_rmse < 2e-2);
      CHECK(mk.rel_rmse < 2e-2);
      CHECK(mv.rel_rmse < 2e-2);
    }
  // What does not fit: fp8, an lse of another shape, scratch of another shape.
  const HostTensor x(DType::bf16, shape), l(DType::f32, rows), s3(DType::f32, sums), bad(DType::f32, {1, H, S + 1});
  kernels::DilatedOptions opt;
  opt.pairs = {{32, 2}};
  auto launches = [&](const HostTensor& lse, const HostTensor& scratch) {
    return kernels::dilated_backward_launches(x.view(), x.view(), x.view(), x.view(), x.view(), lse.view(), x.view(), x.view(), x.view(),
                                              opt, l.view(), l.view(), scratch.view(), s3.view());
  };
  CHECK_THROWS_WITH(launches(bad, s3), doctest::Contains("lse is f32[1, 4, 97] (host): expected f32[1, 4, 96]"));
  CHECK_THROWS_WITH(launches(l, l), doctest::Contains("its acc scratch is f32[1, 4, 96] (host): expected contiguous f32[3, 1, 4, 96, 32]"));
  opt.fp8 = true;
  CHECK_THROWS_WITH(launches(l, s3), doctest::Contains("16-bit only (no FP8 backward of dilated attention yet)"));
}

TEST_CASE("dilated FP8 quantizes once where every offset's keys start 16-byte aligned, else says why not") {
  const std::vector<kernels::DilatedPair> pairs = {{2048, 1}, {4096, 2}, {8192, 4}};
  CHECK(kernels::dilated_fp8_quantize_once_fits(8192, pairs));
  CHECK(kernels::dilated_fp8_quantize_once_fits(2048, pairs));   // segments longer than S
  CHECK_FALSE(kernels::dilated_fp8_quantize_once_fits(8190, pairs));   // 4 does not divide S
  CHECK_FALSE(kernels::dilated_fp8_quantize_once_fits(8200, pairs));   // 8200 / 4 = 2050: not a multiple of 16
  HostTensor t(DType::bf16, {1, 4, 8200, 64});
  kernels::DilatedFp8Inputs in;
  CHECK_THROWS_WITH(kernels::dilated_quantize(t.view(), t.view(), t.view(), pairs, in),
                    doctest::Contains("S = 8200 must be a multiple of 16·r for every rate r"));
  kernels::DilatedOptions opt;
  opt.pairs = pairs;
  kernels::DilatedWorkspace ws;
  CHECK_THROWS_WITH(kernels::dilated_attention_fp8(in, t.view(), opt, ws),
                    doctest::Contains("the inputs were not quantized for these pairs (run dilated_quantize first)"));
}

TEST_CASE("dilated_attention_forward: pairs that do not fit are errors naming them") {
  TensorView t{reinterpret_cast<void*>(256), DType::bf16, {1, 6, 64, 64}, {}, Device::cuda};
  kernels::DilatedWorkspace ws;
  kernels::DilatedOptions opt;
  CHECK_THROWS_WITH(kernels::dilated_attention_forward(t, t, t, t, opt, ws), doctest::Contains("no (segment, rate) pairs"));
  opt.pairs = {{64, 4}};   // 4 does not divide 6 heads
  CHECK_THROWS_WITH(kernels::dilated_attention_forward(t, t, t, t, opt, ws),
                    doctest::Contains("pair (segment 64, rate 4): the rate must divide the segment length and the number of heads (6)"));
  opt.pairs = {{60, 8}};
  CHECK_THROWS_WITH(kernels::dilated_attention_forward(t, t, t, t, opt, ws), doctest::Contains("pair (segment 60, rate 8)"));
  TensorView o = t;
  o.shape = {1, 6, 32, 64};
  opt.pairs = {{64, 2}};
  CHECK_THROWS_WITH(kernels::dilated_attention_forward(t, t, t, o, opt, ws), doctest::Contains("must all be [B, H, S, D]"));
}

namespace {

// Offset j's view of a [B, H, S, D] tensor at `base` with these strides: heads j, j + r, ..., rows j, j + r, ...
TensorView offset_of(char* base, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t j, int64_t r) {
  TensorView t{base + (j * strides[1] + j * strides[2]) * 2, DType::bf16, shape, strides, Device::cuda};
  t.shape[1] = (shape[1] + r - 1 - j) / r;
  t.shape[2] = (shape[2] - j + r - 1) / r;
  t.strides[1] *= r;
  t.strides[2] *= r;
  return t;
}

const char* address(const TensorView& t, const std::vector<int64_t>& index) {
  const char* a = static_cast<const char*>(t.data);
  for (size_t d = 0; d < index.size(); ++d) a += index[d] * t.strides[d] * size_bytes(t.dtype);
  return a;
}

}  // namespace

TEST_CASE("dilated attention runs whole segments as heads of plain attention, element by element") {
  char* base = reinterpret_cast<char*>(uintptr_t{1} << 20);
  const int64_t B = 3, H = 4, S = 64, D = 16, r = 2, segment = 16 / r;   // pair (16, 2): 4 segments per offset
  const std::vector<int64_t> shape = {B, H, S, D}, contiguous = {H * S * D, S * D, D, 1};
  const int64_t count = S / r / segment;
  for (int64_t j = 0; j < r; ++j) {
    const TensorView view = offset_of(base, shape, contiguous, j, r);   // [B, H/r, S/r, D]
    const std::optional<TensorView> heads = kernels::dilated_segments_as_heads(view, 2, count);
    REQUIRE(heads.has_value());
    CHECK(heads->shape == std::vector<int64_t>{B * H / r, count, segment, D});
    int64_t mismatches = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t a = 0; a < H / r; ++a)
        for (int64_t s = 0; s < count; ++s)
          for (int64_t t = 0; t < segment; ++t)
            for (int64_t d = 0; d < D; ++d)
              mismatches += address(*heads, {b * (H / r) + a, s, t, d}) != address(view, {b, a, s * segment + t, d});
    CHECK(mismatches == 0);
  }
  // Rows in the last dim (Vᵀ [B, H', D, rows]): the segments move next to the heads.
  TensorView vt{base, DType::e4m3, {B, H / r, D, S / r}, {H * D * S, r * D * S, S, 1}, Device::cuda};
  const std::optional<TensorView> vt_heads = kernels::dilated_segments_as_heads(vt, 3, count);
  REQUIRE(vt_heads.has_value());
  CHECK(vt_heads->shape == std::vector<int64_t>{B * H / r, count, D, segment});
  CHECK(vt_heads->strides == std::vector<int64_t>{r * D * S, segment, S, 1});
  // A descale per (b, h): every segment reads its head's.
  TensorView scale{base, DType::f32, {B, H / r}, {H, r}, Device::cuda};
  const std::optional<TensorView> scale_heads = kernels::dilated_segments_as_heads(scale, -1, count);
  REQUIRE(scale_heads.has_value());
  CHECK(scale_heads->shape == std::vector<int64_t>{B * H / r, count});
  CHECK(scale_heads->strides == std::vector<int64_t>{r, 0});
  // Not so: batch entries apart, rows that do not split into `count`, rows in the batch or head dim.
  const std::vector<int64_t> padded = {2 * H * S * D, S * D, D, 1};
  CHECK_FALSE(kernels::dilated_segments_as_heads(offset_of(base, shape, padded, 0, r), 2, count));
  CHECK_FALSE(kernels::dilated_segments_as_heads(offset_of(base, shape, contiguous, 0, r), 2, 3));
  CHECK_FALSE(kernels::dilated_segments_as_heads(offset_of(base, shape, contiguous, 0, r), 1, count));
  CHECK_FALSE(kernels::dilated_segments_as_heads(offset_of(base, shape, contiguous, 0, r), 4, count));
}

TEST_CASE("gpu: dilated attention (LongNet pairs mixed) matches float64 in bf16 and FP8, causal and not") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(82);
  // S = 1000: not a multiple of the segments, FP8 quantizes view by view; S = 1024: FP8 quantizes
  // once (dilated_quantize) and the attentions read strided views of it.
  // Without a pair of rate 1, o and the LSE start empty and every pair merges into them.
  // Views of whole segments run as plain attention (S = 1024: the rate-1 pair's segments as heads;
  // the last set: one segment per view), the others with the segment mask.
  const std::vector<std::vector<kernels::DilatedPair>> pair_sets = {
      {{128, 1}, {256, 2}, {512, 4}}, {{512, 4}, {256, 2}}, {{1024, 1}, {2048, 2}}};
  for (const auto& pairs : pair_sets)
  for (const int64_t S : {int64_t{1000}, int64_t{1024}}) {
  const int64_t B = 2, H = 4, D = 64;   // B = 2: segments as heads fold across batch entries
  CHECK(kernels::dilated_fp8_quantize_once_fits(S, pairs) == (S == 1024));
  HostTensor q = randn(DType::bf16, {B, H, S, D}, rng), k = randn(DType::bf16, {B, H, S, D}, rng),
             v = randn(DType::bf16, {B, H, S, D}, rng);
  DeviceTensor qd = DeviceTensor::from_host(q), kd = DeviceTensor::from_host(k), vd = DeviceTensor::from_host(v);
  for (bool causal : {false, true}) {
    std::vector<PartResult> parts;
    for (const auto& pr : pairs) parts.push_back(dilated_pair_f64(q.values(), k.values(), v.values(), B, H, S, D, pr, causal));
    const std::vector<double> want = mix_f64(parts, B * H * S, D);
    for (bool fp8 : {false, true}) {
      INFO("S " << S << " causal " << causal << " fp8 " << fp8 << " pairs " << pairs.size());
      DeviceTensor o(DType::bf16, {B, H, S, D});
      o.fill_bytes(0xFF);
      kernels::DilatedOptions opt;
      opt.pairs = pairs;
      opt.fp8 = fp8;
      opt.causal = causal;
      kernels::DilatedWorkspace ws;
      kernels::dilated_attention_forward(qd.view(), kd.view(), vd.view(), o.view(), opt, ws);
      runtime::synchronize();
      Metrics m = compare(o.to_host().values(), want);
      MESSAGE(fmt::format("dilated attention, {} pairs, S {} {}{} vs float64: {}", pairs.size(), S, fp8 ? "fp8" : "bf16",
                          causal ? " causal" : "", str(m)));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= (fp8 ? 6e-2 : 1e-2));
      // Again with the same workspace, whose buffers (the LSE, the 16-bit path's unit descales)
      // are now reused, not uploaded: the same bits.
      DeviceTensor o_again(DType::bf16, {B, H, S, D});
      o_again.fill_bytes(0xFF);
      kernels::dilated_attention_forward(qd.view(), kd.view(), vd.view(), o_again.view(), opt, ws);
      runtime::synchronize();
      const HostTensor first = o.to_host(), again = o_again.to_host();
      CHECK(std::memcmp(first.data(), again.data(), first.size_bytes()) == 0);
      // Every attention on a given config instead of the defaults: 64 x 64 tiles.
      opt.attention_config = Config();
      opt.attention_config->blocks = {{"m", 64}, {"n", 64}};
      if (fp8) opt.attention_config->knobs = {{"attn_lean_producer", 1}, {"attn_overlap", 0}};
      DeviceTensor o_tiles(DType::bf16, {B, H, S, D});
      o_tiles.fill_bytes(0xFF);
      kernels::dilated_attention_forward(qd.view(), kd.view(), vd.view(), o_tiles.view(), opt, ws);
      runtime::synchronize();
      Metrics mt = compare(o_tiles.to_host().values(), want);
      MESSAGE(fmt::format("  with config {}: {}", opt.attention_config->to_json(), str(mt)));
      CHECK(mt.nan == 0);
      CHECK(mt.rel_rmse <= (fp8 ? 6e-2 : 1e-2));
      // o whose batch entries lie 2 H heads apart: bf16 runs every pair with the segment mask
      // instead of segments as heads; FP8 stored the rate-1 pair's V by segment and says so.
      if (S != 1024 || pairs.front().segment != 128) continue;
      DeviceTensor wide(DType::bf16, {2 * B, H, S, D});
      wide.fill_bytes(0xFF);
      TensorView o_apart = wide.view();
      o_apart.shape[0] = B;
      o_apart.strides = {2 * H * S * D, S * D, D, 1};
      opt.attention_config.reset();
      if (fp8) {
        CHECK_THROWS_WITH(kernels::dilated_attention_forward(qd.view(), kd.view(), vd.view(), o_apart, opt, ws),
                          doctest::Contains("must hold its batch entries H heads apart"));
        // v whose batch entries lie apart: dilated_quantize quantizes the rate-1 pair's V segment by
        // segment instead of as heads of one launch; the same result.
        HostTensor v_wide(DType::bf16, {2 * B, H, S, D});
        for (int64_t i = 0; i < v_wide.numel(); ++i)
          v_wide.set(i, (i / (H * S * D)) % 2 == 0 ? v.at(i / (2 * H * S * D) * H * S * D + i % (H * S * D)) : 1e4);
        DeviceTensor v_wide_d = DeviceTensor::from_host(v_wide);
        TensorView v_apart = v_wide_d.view();
        v_apart.shape[0] = B;
        v_apart.strides = {2 * H * S * D, S * D, D, 1};
        DeviceTensor o_v(DType::bf16, {B, H, S, D});
        o_v.fill_bytes(0xFF);
        kernels::dilated_attention_forward(qd.view(), kd.view(), v_apart, o_v.view(), opt, ws);
        runtime::synchronize();
        const HostTensor o_v_host = o_v.to_host();
        CHECK(std::memcmp(first.data(), o_v_host.data(), first.size_bytes()) == 0);
        continue;
      }
      kernels::dilated_attention_forward(qd.view(), kd.view(), vd.view(), o_apart, opt, ws);
      runtime::synchronize();
      const std::vector<double> all = wide.to_host().values();
      std::vector<double> got;
      for (int64_t b = 0; b < B; ++b)
        got.insert(got.end(), all.begin() + 2 * b * H * S * D, all.begin() + (2 * b + 1) * H * S * D);
      Metrics ma = compare(got, want);
      MESSAGE(fmt::format("  into o with batch entries apart: {}", str(ma)));
      CHECK(ma.nan == 0);
      CHECK(ma.rel_rmse <= 1e-2);
    }
  }
  }
}

TEST_CASE("gpu: dilated attention backward after its forward: float64 gradients of the pairs' mix (bf16, causal and not)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(87);
  const int64_t B = 1, H = 4, S = 1000, D = 64;
  const std::vector<int64_t> shape = {B, H, S, D};
  const std::vector<kernels::DilatedPair> pairs = {{128, 1}, {256, 2}, {512, 4}};
  const HostTensor q = randn(DType::bf16, shape, rng), k = randn(DType::bf16, shape, rng), v = randn(DType::bf16, shape, rng),
                   dout = randn(DType::bf16, shape, rng);
  const DeviceTensor qd = DeviceTensor::from_host(q), kd = DeviceTensor::from_host(k), vd = DeviceTensor::from_host(v),
                     dod = DeviceTensor::from_host(dout);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    const DilatedF64 want = dilated_f64(q, k, v, dout, pairs, causal);
    kernels::DilatedOptions opt;
    opt.pairs = pairs;
    opt.causal = causal;
    DeviceTensor o(DType::bf16, shape), dq(DType::bf16, shape), dk(DType::bf16, shape), dv(DType::bf16, shape);
    kernels::DilatedWorkspace ws;
    kernels::dilated_attention_forward(qd.view(), kd.view(), vd.view(), o.view(), opt, ws);
    for (DeviceTensor* t : {&dq, &dk, &dv}) t->fill_bytes(0xFF);   // NaN poison
    kernels::DilatedBackwardWorkspace bws;
    kernels::dilated_attention_backward(qd.view(), kd.view(), vd.view(), o.view(), dod.view(), ws.lse->view(), dq.view(), dk.view(),
                                        dv.view(), opt, bws);
    runtime::synchronize();
    const Metrics mq = compare(dq.to_host().values(), want.dq), mk = compare(dk.to_host().values(), want.dk),
                  mv = compare(dv.to_host().values(), want.dv);
    MESSAGE("dilated backward on the GPU vs float64: dq ", str(mq), "; dk ", str(mk), "; dv ", str(mv));
    CHECK(mq.nan + mk.nan + mv.nan == 0);
    CHECK(mq.rel_rmse < 2e-2);
    CHECK(mk.rel_rmse < 2e-2);
    CHECK(mv.rel_rmse < 2e-2);
  }
}

TEST_CASE("gpu: dilated FP8 quantizes V once per head where every view gives each amax chunk rows") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(83);
  // B·H = 64 at S = 1024: 8 amax chunks per head, and every view has at least 512 rows (the rate-1
  // pair's segments of 512 as heads, the rate-2 pair's 512 rows per offset).
  const int64_t B = 2, H = 32, S = 1024, D = 64;
  const std::vector<kernels::DilatedPair> pairs = {{512, 1}, {1024, 2}};
  HostTensor q = randn(DType::bf16, {B, H, S, D}, rng), k = randn(DType::bf16, {B, H, S, D}, rng),
             v = randn(DType::bf16, {B, H, S, D}, rng);
  DeviceTensor qd = DeviceTensor::from_host(q), kd = DeviceTensor::from_host(k), vd = DeviceTensor::from_host(v);
  std::vector<PartResult> parts;
  for (const auto& pr : pairs) parts.push_back(dilated_pair_f64(q.values(), k.values(), v.values(), B, H, S, D, pr, false));
  const std::vector<double> want = mix_f64(parts, B * H * S, D);
  DeviceTensor o(DType::bf16, {B, H, S, D});
  o.fill_bytes(0xFF);
  kernels::DilatedOptions opt;
  opt.pairs = pairs;
  opt.fp8 = true;
  kernels::DilatedWorkspace ws;
  kernels::dilated_attention_forward(qd.view(), kd.view(), vd.view(), o.view(), opt, ws);
  runtime::synchronize();
  Metrics m = compare(o.to_host().values(), want);
  MESSAGE(fmt::format("dilated attention fp8, V quantized once per head, vs float64: {}", str(m)));
  CHECK(m.nan == 0);
  CHECK(m.rel_rmse <= 6e-2);
  // Every view of a head took the head's descale: the rate-1 pair's segments and the rate-2 pair's
  // offset (of its heads) alike, and the head's amax / 448 from V itself.
  const std::vector<double> seg = ws.fp8.vd[0].to_host().values();   // [B, H, 2]
  const std::vector<double> off = ws.fp8.vd[1].to_host().values();   // [2, B, H]
  const std::vector<double> vals = v.values();
  int64_t mismatches = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      double amax = 0;
      for (int64_t i = 0; i < S * D; ++i) amax = std::max(amax, std::fabs(vals[(b * H + h) * S * D + i]));
      const double want_descale = static_cast<float>(static_cast<float>(amax) * (1.0f / 448.0f));
      mismatches += seg[(b * H + h) * 2] != want_descale || seg[(b * H + h) * 2 + 1] != want_descale ||
                    off[((h % 2) * B + b) * H + h] != want_descale;
    }
  CHECK(mismatches == 0);
}
