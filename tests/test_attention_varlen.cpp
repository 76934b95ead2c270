// attention_varlen_forward (kernels/attention_varlen.h): packed sequences with cu_seqlens, on the
// document mask of the tensor-core attention. Argument errors on the CPU; on the GPU, every
// sequence against float64 attention of its own rows (bf16 and the FP8 pipeline, causal and not,
// grouped-query heads, lengths that end inside a tile), the LSE, and a bad cu_seqlens.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention_accuracy.h"
#include "core/error.h"
#include "gpu.h"
#include "gpu_run.h"
#include "kernels/attention_varlen.h"
#include "runtime/driver.h"
#include "runtime/owned_tensor.h"

using namespace tj;

namespace {

using tj_test::fake_device_view;
TensorView device_view(DType t, std::vector<int64_t> shape) { return fake_device_view(t, std::move(shape)); }

std::string error_of(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu, const TensorView& o,
                     const kernels::AttentionVarlenOptions& opt = {}) {
  kernels::AttentionFp8Workspace ws;
  try {
    kernels::attention_varlen_forward(q, k, v, cu, o, opt, ws);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// float64 attention of each sequence's own rows: o [T, H, D] and lse [H, T] (natural log).
void reference(const HostTensor& q, const HostTensor& k, const HostTensor& v, const std::vector<int64_t>& cu, bool causal,
               double scale, std::vector<double>& o, std::vector<double>& lse) {
  const int64_t T = q.shape()[0], H = q.shape()[1], D = q.shape()[2], Hkv = k.shape()[1], g = H / Hkv;
  o.assign(T * H * D, 0.0);
  lse.assign(H * T, 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t r = cu[s]; r < cu[s + 1]; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t last = causal ? r : cu[s + 1] - 1;
        std::vector<double> p;
        double mx = -INFINITY;
        for (int64_t j = cu[s]; j <= last; ++j) {
          double d = 0;
          for (int64_t x = 0; x < D; ++x) d += q.at((r * H + h) * D + x) * k.at((j * Hkv + h / g) * D + x);
          p.push_back(d * scale);
          mx = std::max(mx, p.back());
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        lse[h * T + r] = mx + std::log(sum);
        for (int64_t x = 0; x < D; ++x) {
          double acc = 0;
          for (int64_t j = cu[s]; j <= last; ++j) acc += p[j - cu[s]] * v.at((j * Hkv + h / g) * D + x);
          o[(r * H + h) * D + x] = acc / sum;
        }
      }
}

}  // namespace

TEST_CASE("attention_varlen_forward: argument errors name what is wrong") {
  const TensorView q = device_view(DType::bf16, {577, 4, 128}), kv = device_view(DType::bf16, {577, 2, 128}),
                   o = device_view(DType::bf16, {577, 4, 128}), cu = device_view(DType::i32, {4});
  CHECK(error_of(device_view(DType::bf16, {1, 577, 4, 128}), kv, kv, cu, o).find("packed [T, heads, D]") != std::string::npos);
  CHECK(error_of(q, device_view(DType::bf16, {576, 2, 128}), device_view(DType::bf16, {576, 2, 128}), cu, o)
            .find("share one packing") != std::string::npos);
  CHECK(error_of(q, kv, kv, device_view(DType::f32, {4}), o).find("cu_seqlens is i32 or i64 [N + 1]") != std::string::npos);
  CHECK(error_of(q, kv, kv, device_view(DType::i32, {1}), o).find("N >= 1 sequences") != std::string::npos);
  TensorView host_q = q;
  host_q.device = Device::host;
  CHECK(error_of(host_q, kv, kv, cu, o).find("must be on the GPU") != std::string::npos);
  kernels::AttentionVarlenOptions opt;
  opt.lse = device_view(DType::f32, {577, 4});
  CHECK(error_of(q, kv, kv, cu, o, opt).find("lse must be f32 [H, T] = [4, 577]") != std::string::npos);
  kernels::AttentionVarlenOptions own;
  own.attention.lse = device_view(DType::f32, {1, 4, 577});
  CHECK(error_of(q, kv, kv, cu, o, own).find("AttentionVarlenOptions::lse") != std::string::npos);
}

TEST_CASE("attention_varlen_forward's key block: the dense default's for 16-bit sequences of 1024 rows or more on average") {
  using kernels::varlen_key_block;
  CHECK(varlen_key_block(16384, 4, false, -1) == 0);
  CHECK(varlen_key_block(16384, 16, false, -1) == 0);   // 1024 rows a sequence
  CHECK(varlen_key_block(16383, 16, false, -1) == 64);
  CHECK(varlen_key_block(16384, 4, true, -1) == 64);    // the FP8 pipeline
  CHECK(varlen_key_block(577, 4, false, 0) == 0);       // as requested
  CHECK(varlen_key_block(16384, 4, false, 64) == 64);
  try {
    varlen_key_block(16384, 4, false, 128);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("key_block is -1 (from the sequence lengths), 0 (the default configs') or 64; got 128") !=
          std::string::npos);
  }
}

TEST_CASE("gpu: attention_varlen_forward on long sequences (the dense default's key blocks, and 64 as asked) matches float64") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(37);
  const std::vector<int64_t> cu = {0, 1100, 2600};   // 1300 rows a sequence on average: key blocks of 0 (the default configs')
  const int64_t T = cu.back(), H = 2, Hkv = 1, D = 128;
  const HostTensor q = tj_test::random_tensor(DType::bf16, {T, H, D}, rng), k = tj_test::random_tensor(DType::bf16, {T, Hkv, D}, rng),
                   v = tj_test::random_tensor(DType::bf16, {T, Hkv, D}, rng);
  const DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v);
  const DeviceTensor dcu = DeviceTensor::from_host(HostTensor::from_values(std::vector<double>(cu.begin(), cu.end()), DType::i64, {3}));
  kernels::AttentionFp8Workspace ws;
  for (bool causal : {false, true}) {
    std::vector<double> want, want_lse;
    reference(q, k, v, cu, causal, 1.0 / std::sqrt(static_cast<double>(D)), want, want_lse);
    for (int64_t key_block : {int64_t{-1}, int64_t{64}}) {
      CAPTURE(causal);
      CAPTURE(key_block);
      DeviceTensor o(DType::bf16, {T, H, D});
      o.fill_bytes(0xFF);
      kernels::AttentionVarlenOptions opt;
      opt.attention.causal = causal;
      opt.attention.quantize = false;
      opt.key_block = key_block;
      kernels::attention_varlen_forward(dq.view(), dk.view(), dv.view(), dcu.view(), o.view(), opt, ws);
      runtime::synchronize();
      const auto m = tj_test::compare(o.to_host().values(), want);
      MESSAGE("varlen bf16 long sequences, key_block ", key_block, causal ? " causal" : "", ": ", tj_test::str(m));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse < 1e-2);
    }
  }
}

TEST_CASE("gpu: attention_varlen_forward matches float64 per sequence (bf16 and FP8, causal and not, GQA, ragged lengths)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(31);
  const std::vector<int64_t> cu = {0, 200, 277, 577, 641};   // lengths 200, 77, 300, 64
  const int64_t T = cu.back(), H = 4, Hkv = 2, D = 128;
  const HostTensor q = tj_test::random_tensor(DType::bf16, {T, H, D}, rng), k = tj_test::random_tensor(DType::bf16, {T, Hkv, D}, rng),
                   v = tj_test::random_tensor(DType::bf16, {T, Hkv, D}, rng);
  const DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v);
  std::vector<double> cu_d(cu.begin(), cu.end());
  const DeviceTensor dcu = DeviceTensor::from_host(HostTensor::from_values(cu_d, DType::i32, {static_cast<int64_t>(cu.size())}));
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  kernels::AttentionFp8Workspace ws;
  for (bool causal : {false, true})
    for (bool fp8 : {false, true}) {
      CAPTURE(causal);
      CAPTURE(fp8);
      std::vector<double> want, want_lse;
      reference(q, k, v, cu, causal, scale, want, want_lse);
      DeviceTensor o(DType::bf16, {T, H, D}), lse(DType::f32, {H, T});
      o.fill_bytes(0xFF);
      lse.fill_bytes(0xFF);
      kernels::AttentionVarlenOptions opt;
      opt.attention.causal = causal;
      opt.attention.quantize = fp8;
      opt.lse = lse.view();
      kernels::attention_varlen_forward(dq.view(), dk.view(), dv.view(), dcu.view(), o.view(), opt, ws);
      runtime::synchronize();
      const double err = tj_test::compare(o.to_host().values(), want).rel_rmse;
      const std::string what = std::string(fp8 ? "fp8" : "bf16") + (causal ? " causal" : "");
      MESSAGE("varlen ", what, ": rel RMSE ", err);
      CHECK(err < (fp8 ? 6e-2 : 1e-2));
      const HostTensor got_lse = lse.to_host();
      double lse_err = 0;
      for (int64_t i = 0; i < H * T; ++i) lse_err = std::max(lse_err, std::abs(got_lse.at(i) - want_lse[i]));
      // fp8: the LSE of the e4m3 P's sums, which divide O (AttentionVariant::merge_into_output): up to a few % off.
      CHECK(lse_err < (fp8 ? 1.5e-1 : 1e-2));
    }
  // A wrong cu_seqlens is an error, not wrong rows.
  auto error_with = [&](std::vector<double> c) -> std::string {
    const DeviceTensor bad = DeviceTensor::from_host(HostTensor::from_values(c, DType::i64, {static_cast<int64_t>(c.size())}));
    DeviceTensor o(DType::bf16, {T, H, D});
    try {
      kernels::attention_varlen_forward(dq.view(), dk.view(), dv.view(), bad.view(), o.view(), {}, ws);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_with({0, 200, 600}).find("cu_seqlens ends at 600, but q, k and v hold 641 rows") != std::string::npos);
  CHECK(error_with({0, 300, 200, 641}).find("cu_seqlens decreases at 2 (200 after 300)") != std::string::npos);
  CHECK(error_with({5, 641}).find("cu_seqlens[0] is 5") != std::string::npos);
}
