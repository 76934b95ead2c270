// The FP8 linear layer (kernels/fp8_linear.h). On the CPU: its argument errors, the bf16
// fallback's reason, the fallback's kernels on the reference executor against float64 and their
// lowering for sm_90a. On the GPU: forward and backward against a float64 product of the same
// quantized values (the quantizers' descales and rounding, emulated on the host) and against the
// exact product, delayed scaling's second call against dynamic scaling, and the fallback.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_accuracy.h"
#include "codegen/cuda_emitter.h"
#include "codegen/lowering.h"
#include "core/error.h"
#include "gpu.h"
#include "gpu_run.h"
#include "kernels/attention_fp8.h"
#include "kernels/fp8_linear.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/reference.h"

using namespace tj;

namespace {

TensorView fake(DType t, std::vector<int64_t> shape) { return tj_test::fake_device_view(t, std::move(shape)); }

std::string forward_error(const TensorView& x, const TensorView& w, const std::optional<TensorView>& bias, const TensorView& y) {
  kernels::Fp8LinearState st;
  try {
    kernels::fp8_linear_forward(x, w, bias, y, {}, st);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// a [R, C] · b [S, C]ᵀ in float64 (values as doubles, row-major).
std::vector<double> matmul_nt(const std::vector<double>& a, const std::vector<double>& b, int64_t R, int64_t S, int64_t C) {
  std::vector<double> out(R * S, 0.0);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < S; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < C; ++k) acc += a[i * C + k] * b[j * C + k];
      out[i * S + j] = acc;
    }
  return out;
}
std::vector<double> transposed(const std::vector<double>& a, int64_t R, int64_t C) {
  std::vector<double> t(R * C);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) t[j * R + i] = a[i * C + j];
  return t;
}
// The quantizers' values: fp8(x / descale) · descale, descale = amax / fp8_max in f32.
std::vector<double> quantized(const std::vector<double>& x, DType fp8) {
  double amax = 0;
  for (double v : x) amax = std::max(amax, std::abs(v));
  const float descale = amax > 0 ? static_cast<float>(amax) * (1.0f / (fp8 == DType::e5m2 ? 57344.0f : 448.0f)) : 1.0f;
  const float inv = 1.0f / descale;
  HostTensor q(fp8, {static_cast<int64_t>(x.size())});
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    q.set(static_cast<int64_t>(i), static_cast<float>(x[i]) * inv);
    out[i] = q.at(static_cast<int64_t>(i)) * descale;
  }
  return out;
}

}  // namespace

TEST_CASE("fp8_linear: argument errors and the bf16 fallback's reason") {
  const TensorView x = fake(DType::bf16, {64, 128}), w = fake(DType::bf16, {32, 128}), y = fake(DType::bf16, {64, 32});
  CHECK(forward_error(fake(DType::f32, {64, 128}), w, std::nullopt, y).find("x must be bf16 or f16 (the layer quantizes its inputs "
                                                                            "itself), got f32[64, 128]") != std::string::npos);
  CHECK(forward_error(x, fake(DType::bf16, {32, 64}), std::nullopt, y).find("do not fit") != std::string::npos);
  CHECK(forward_error(x, w, std::nullopt, fake(DType::bf16, {64, 31})).find("do not fit") != std::string::npos);
  CHECK(forward_error(fake(DType::bf16, {2, 64, 128}), w, std::nullopt, y).find("x must be a matrix [rows, cols]") != std::string::npos);
  CHECK(forward_error(x, w, fake(DType::bf16, {33}), y).find("bias must be [N] = [32] of x's dtype") != std::string::npos);
  TensorView host = x;
  host.device = Device::host;
  CHECK(forward_error(host, w, std::nullopt, y).find("x must be on the GPU") != std::string::npos);
  TensorView cols = x;
  cols.strides = {1, 64};
  CHECK(forward_error(cols, w, std::nullopt, y).find("x's rows must be contiguous") != std::string::npos);
  kernels::Fp8LinearState st;
  try {
    kernels::fp8_linear_backward(fake(DType::bf16, {64, 16}), x, w, x, w, {}, st);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("fp8_linear backward: dy [M, N] bf16[64, 16]") != std::string::npos);
  }
  CHECK(!kernels::fp8_linear_fallback_reason(64, 32, 128));
  CHECK(*kernels::fp8_linear_fallback_reason(40, 32, 128) ==
        "M = 40 is not a multiple of 16 (FP8 wgmma reads K-major tiles of 16 elements, and every dim is some product's K)");
  CHECK(kernels::fp8_linear_fallback_reason(64, 32, 100)->rfind("K = 100", 0) == 0);
}

TEST_CASE("fp8_linear: the bf16 fallback's kernels match float64 on the reference executor and lower to wgmma") {
  std::mt19937 rng(5);
  const int64_t M = 40, N = 24, K = 56;   // multiples of 8, not of 16
  const HostTensor x = tj_test::random_tensor(DType::bf16, {M, K}, rng), w = tj_test::random_tensor(DType::bf16, {N, K}, rng),
                   bias = tj_test::random_tensor(DType::bf16, {N}, rng), dy = tj_test::random_tensor(DType::bf16, {M, N}, rng);
  HostTensor y(DType::f32, {M, N}), dx(DType::f32, {M, K}), dw(DType::f32, {N, K});
  for (HostTensor* t : {&y, &dx, &dw}) t->fill_bytes(0xFF);
  auto spec = [](const HostTensor& t) { return ArgSpec(contiguous_spec(t.dtype(), t.shape())); };
  const ir::Function fy = kernels::linear_bf16().trace({spec(x), spec(w), spec(bias), spec(y)});
  const ir::Function fdx = kernels::linear_bf16_dx().trace({spec(dy), spec(w), spec(dx)});
  const ir::Function fdw = kernels::linear_bf16_dw().trace({spec(dy), spec(x), spec(dw)});
  const Config small = Config::from_json(R"({"blocks":{"m":16,"n":16,"k":16},"num_warps":4})");
  run_reference(fy, small, {x.view(), w.view(), bias.view(), y.view()});
  run_reference(fdx, small, {dy.view(), w.view(), dx.view()});
  run_reference(fdw, small, {dy.view(), x.view(), dw.view()});
  std::vector<double> want_y = matmul_nt(x.values(), w.values(), M, N, K);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) want_y[i * N + j] += bias.at(j);
  const std::vector<double> want_dx = matmul_nt(dy.values(), transposed(w.values(), N, K), M, K, N);
  const std::vector<double> want_dw = matmul_nt(transposed(dy.values(), M, N), transposed(x.values(), M, K), N, K, M);
  CHECK(tj_test::compare(y.values(), want_y).rel_rmse < 1e-6);
  CHECK(tj_test::compare(dx.values(), want_dx).rel_rmse < 1e-6);
  CHECK(tj_test::compare(dw.values(), want_dw).rel_rmse < 1e-6);
  for (const ir::Function* f : {&fy, &fdx, &fdw}) {
    CAPTURE(f->name);
    const auto g = codegen::generate_cuda(*f, codegen::untuned_config(*f, "sm_90a"), codegen::Target::parse("sm_90a"));
    CHECK((g.lowering == "tensor cores (wgmma)" || g.lowering == "sm90_gemm"));   // y: the GEMM pattern's lowering takes it
  }
}

TEST_CASE("fp8_linear: the quantizers see a wide matrix as heads of 128 columns, one descale, the transpose in place (reference executor)") {
  std::mt19937 rng(7);
  const int64_t rows = 48, cols = 640;   // 5 heads of 128 columns
  const int64_t D = kernels::fp8_linear_quantizer_width(cols), H = cols / D;
  CHECK(D == 128);
  CHECK(kernels::fp8_linear_quantizer_width(48) == 16);
  const HostTensor x = tj_test::random_tensor(DType::bf16, {rows, cols}, rng);
  const int64_t C = kernels::attention_fp8_quantize_chunks(H, rows);
  HostTensor partial(DType::f32, {H * C}), y(DType::e4m3, {rows, cols}), yt(DType::e4m3, {cols, rows}), descale(DType::f32, {1, H}),
      descale_t(DType::f32, {1, H});
  for (HostTensor* t : {&partial, &y, &yt, &descale, &descale_t}) t->fill_bytes(0xFF);
  const TensorView x4 = kernels::fp8_linear_quantizer_view(x.view(), D);
  TensorView p3 = partial.view();
  p3.shape = {1, H, C};
  auto spec = [](const TensorView& v) { return ArgSpec(TensorSpec{v.dtype, v.shape, unit_strides(v.effective_strides())}); };
  const ir::Function famax = kernels::chunk_amax().trace({spec(x4), spec(p3)});
  run_reference(famax, kernels::chunk_amax_config(), {x4, p3});
  const TensorView all = kernels::fp8_linear_all_chunks(partial.view(), H, H * C);
  const TensorView y4 = kernels::fp8_linear_quantizer_view(y.view(), D);
  TensorView yt4 = yt.view();
  yt4.shape = {1, H, D, rows};
  const ir::Function fq = kernels::quantize_fp8_chunked().trace({spec(x4), spec(all), spec(y4), spec(descale.view())});
  run_reference(fq, kernels::chunked_quantize_config(false), {x4, all, y4, descale.view()});
  const ir::Function fqt = kernels::quantize_transpose_fp8_chunked().trace({spec(x4), spec(all), spec(yt4), spec(descale_t.view())});
  run_reference(fqt, kernels::chunked_quantize_config(true), {x4, all, yt4, descale_t.view()});
  // One descale, the whole matrix's, for every head; y and yᵀ hold the same values.
  double amax = 0;
  for (double v : x.values()) amax = std::max(amax, std::abs(v));
  for (int64_t h = 0; h < H; ++h) {
    CHECK(descale.at(h) == doctest::Approx(amax / 448.0).epsilon(1e-6));
    CHECK(descale_t.at(h) == descale.at(0));
  }
  const std::vector<double> want = quantized(x.values(), DType::e4m3);
  int64_t off = 0, off_t = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      off += std::abs(y.at(i * cols + j) * descale.at(0) - want[i * cols + j]) > 1e-6 * std::abs(want[i * cols + j]);
      off_t += yt.at(j * rows + i) != y.at(i * cols + j);
    }
  CHECK(off == 0);
  CHECK(off_t == 0);
}

TEST_CASE("gpu: fp8_linear forward and backward match float64 of the quantized operands (dynamic and delayed scaling, bias, "
          "the bf16 fallback)") {
  TJ_REQUIRE_HOPPER();
  std::mt19937 rng(29);
  const int64_t M = 256, N = 192, K = 320;
  const HostTensor x = tj_test::random_tensor(DType::bf16, {M, K}, rng), w = tj_test::random_tensor(DType::bf16, {N, K}, rng, 0.05),
                   bias = tj_test::random_tensor(DType::bf16, {N}, rng), dy = tj_test::random_tensor(DType::bf16, {M, N}, rng, 1e-3);
  const DeviceTensor gx = DeviceTensor::from_host(x), gw = DeviceTensor::from_host(w), gb = DeviceTensor::from_host(bias),
                     gdy = DeviceTensor::from_host(dy);
  DeviceTensor y(DType::bf16, {M, N}), y2(DType::bf16, {M, N}), dx(DType::f32, {M, K}), dw(DType::f32, {N, K});
  for (DeviceTensor* t : {&y, &y2, &dx, &dw}) t->fill_bytes(0xFF);
  kernels::Fp8LinearState st;
  kernels::fp8_linear_forward(gx.view(), gw.view(), gb.view(), y.view(), {}, st);
  kernels::fp8_linear_backward(gdy.view(), gx.view(), gw.view(), dx.view(), dw.view(), {}, st);
  runtime::synchronize();
  // The same products of the quantized values in float64 (tight), and of the exact ones (loose).
  const std::vector<double> xq = quantized(x.values(), DType::e4m3), wq = quantized(w.values(), DType::e4m3),
                            dyq = quantized(dy.values(), DType::e5m2);
  std::vector<double> want_y = matmul_nt(xq, wq, M, N, K), exact_y = matmul_nt(x.values(), w.values(), M, N, K);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      want_y[i * N + j] += bias.at(j);
      exact_y[i * N + j] += bias.at(j);
    }
  const std::vector<double> want_dx = matmul_nt(dyq, transposed(wq, N, K), M, K, N),
                            exact_dx = matmul_nt(dy.values(), transposed(w.values(), N, K), M, K, N);
  const std::vector<double> want_dw = matmul_nt(transposed(dyq, M, N), transposed(xq, M, K), N, K, M),
                            exact_dw = matmul_nt(transposed(dy.values(), M, N), transposed(x.values(), M, K), N, K, M);
  struct Row {
    const char* name;
    HostTensor got;
    const std::vector<double>& want;
    const std::vector<double>& exact;
    double tight, loose;
  };
  const Row rows[] = {{"y", y.to_host(), want_y, exact_y, 1e-2, 6e-2},   // y rounds to bf16
                      {"dx", dx.to_host(), want_dx, exact_dx, 1e-3, 1.2e-1},
                      {"dw", dw.to_host(), want_dw, exact_dw, 1e-3, 1.2e-1}};
  for (const Row& r : rows) {
    const auto q = tj_test::compare(r.got.values(), r.want), e = tj_test::compare(r.got.values(), r.exact);
    MESSAGE("fp8_linear ", std::string(r.name), ": vs float64 of the quantized operands ", tj_test::str(q), "; vs the exact product ", tj_test::str(e));
    CAPTURE(std::string(r.name));
    CHECK(q.nan == 0);
    CHECK(q.rel_rmse < r.tight);
    CHECK(e.rel_rmse < r.loose);
  }
  // Delayed scaling: the first call scales dynamically, the second from the first's amaxes --
  // the same inputs give the same bits as dynamic scaling.
  kernels::Fp8LinearState delayed;
  kernels::Fp8LinearOptions d;
  d.scaling = kernels::Fp8Scaling::delayed;
  for (int call = 0; call < 2; ++call) {
    y2.fill_bytes(0xFF);
    kernels::fp8_linear_forward(gx.view(), gw.view(), gb.view(), y2.view(), d, delayed);
    runtime::synchronize();
    const HostTensor a = y.to_host(), b = y2.to_host();
    CAPTURE(call);
    CHECK(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
  }
  // The bf16 fallback: M not a multiple of 16 (tensor cores), then K not a multiple of 8 (SIMT).
  for (auto [m, k] : {std::pair<int64_t, int64_t>{40, 320}, std::pair<int64_t, int64_t>{48, 20}}) {
    CAPTURE(m);
    CAPTURE(k);
    const HostTensor fx = tj_test::random_tensor(DType::bf16, {m, k}, rng), fw = tj_test::random_tensor(DType::bf16, {N, k}, rng),
                     fdy = tj_test::random_tensor(DType::bf16, {m, N}, rng);
    const DeviceTensor ax = DeviceTensor::from_host(fx), aw = DeviceTensor::from_host(fw), ady = DeviceTensor::from_host(fdy);
    DeviceTensor fy(DType::f32, {m, N}), fdx(DType::f32, {m, k}), fdw(DType::f32, {N, k});
    for (DeviceTensor* t : {&fy, &fdx, &fdw}) t->fill_bytes(0xFF);
    kernels::Fp8LinearState fs;
    kernels::fp8_linear_forward(ax.view(), aw.view(), std::nullopt, fy.view(), {}, fs);
    kernels::fp8_linear_backward(ady.view(), ax.view(), aw.view(), fdx.view(), fdw.view(), {}, fs);
    runtime::synchronize();
    CHECK(tj_test::compare(fy.to_host().values(), matmul_nt(fx.values(), fw.values(), m, N, k)).rel_rmse < 1e-5);
    CHECK(tj_test::compare(fdx.to_host().values(), matmul_nt(fdy.values(), transposed(fw.values(), N, k), m, k, N)).rel_rmse < 1e-5);
    CHECK(tj_test::compare(fdw.to_host().values(), matmul_nt(transposed(fdy.values(), m, N), transposed(fx.values(), m, k), N, k, m))
              .rel_rmse < 1e-5);
  }
}
