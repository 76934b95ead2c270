#include "kernels/fp8_linear.h"

#include <fmt/format.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <tuple>

#include "autotune/launch.h"
#include "core/error.h"
#include "dsl/api.h"
#include "kernels/attention_fp8.h"
#include "kernels/library.h"

namespace tj::kernels {

const Kernel& linear_bf16() {   // y = x wᵀ + bias (bias of 0 elements: none)
  static const Kernel k = kernel("fp8_linear_fallback_y", {"x", "w", "bias", "y"}, [](In x, In w, In bias, Out y) {
    auto [M, K] = x.shape<2>();
    auto N = w.dim(0);
    for (auto m : tile(M, block("m")))
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto kk : tile(K, block("k"))) acc = dot(x.load(m, kk), w.load(n, kk).T(), acc);
        Tile out = acc;
        if (bias.static_dim(0) != 0) out = out + bias.load(n).to(DType::f32).row();
        y.store(m, n, out.to(y.dtype()));
      }
  });
  return k;
}
const Kernel& linear_bf16_dx() {   // dx = dy w
  static const Kernel k = kernel("fp8_linear_fallback_dx", {"dy", "w", "dx"}, [](In dy, In w, Out dx) {
    auto [M, N] = dy.shape<2>();
    auto K = w.dim(1);
    for (auto m : tile(M, block("m")))
      for (auto kk : tile(K, block("n"))) {
        Var acc = zeros({m, kk}, DType::f32);
        for (auto n : tile(N, block("k"))) acc = dot(dy.load(m, n), w.load(n, kk), acc);
        dx.store(m, kk, Tile(acc).to(dx.dtype()));
      }
  });
  return k;
}
const Kernel& linear_bf16_dw() {   // dw = dyᵀ x
  static const Kernel k = kernel("fp8_linear_fallback_dw", {"dy", "x", "dw"}, [](In dy, In x, Out dw) {
    auto [M, N] = dy.shape<2>();
    auto K = x.dim(1);
    for (auto n : tile(N, block("m")))
      for (auto kk : tile(K, block("n"))) {
        Var acc = zeros({n, kk}, DType::f32);
        for (auto m : tile(M, block("k"))) acc = dot(dy.load(m, n).T(), x.load(m, kk), acc);
        dw.store(n, kk, Tile(acc).to(dw.dtype()));
      }
  });
  return k;
}

namespace {

void check_matrix(const TensorView& t, const char* what, bool input) {
  if (t.rank() != 2) throw Error(fmt::format("fp8_linear: {} must be a matrix [rows, cols], got {}", what, t.describe()));
  if (t.device != Device::cuda) throw Error(fmt::format("fp8_linear: {} must be on the GPU, got {}", what, t.describe()));
  const bool ok = input ? (t.dtype == DType::bf16 || t.dtype == DType::f16)
                        : (t.dtype == DType::bf16 || t.dtype == DType::f16 || t.dtype == DType::f32);
  if (!ok)
    throw Error(fmt::format("fp8_linear: {} must be {} (the layer quantizes its inputs itself), got {}", what,
                            input ? "bf16 or f16" : "bf16, f16 or f32", t.describe()));
  if (t.effective_strides()[1] != 1)
    throw Error(fmt::format("fp8_linear: {}'s rows must be contiguous (last stride 1), got {}", what, t.describe()));
}

void say_fallback_once(int64_t M, int64_t N, int64_t K, const std::string& why) {
  static std::mutex mu;
  static std::set<std::tuple<int64_t, int64_t, int64_t>> said;
  std::lock_guard lock(mu);
  if (said.insert({M, N, K}).second)
    std::fprintf(stderr, "tilejit: fp8_linear [%lld, %lld] x [%lld, %lld]^T runs in bf16: %s\n", (long long)M, (long long)K,
                 (long long)N, (long long)K, why.c_str());
}

// The fallback's launch options: the generic tensor-core lowering where every row is 16-byte
// aligned (a multiple of 8 elements), else the SIMT path.
LaunchOptions fallback_options(int64_t M, int64_t N, int64_t K, CUstream stream) {
  LaunchOptions lo;
  lo.stream = stream;
  if (M % 8 != 0 || N % 8 != 0 || K % 8 != 0) {
    Config c;
    c.blocks = {{"m", 64}, {"n", 64}, {"k", 32}};
    c.num_warps = 4;
    c.knobs = {{"mma", 0}};
    lo.config = c;
  }
  return lo;
}

// The state's copy for `role`, [rows, cols] of `dtype`, grown as needed; a view of that shape.
TensorView copy_view(Fp8LinearState& st, int role, DType dtype, int64_t rows, int64_t cols) {
  std::optional<DeviceTensor>& c = st.copy[role];
  if (!c || c->dtype() != dtype || c->view().numel() < rows * cols) c.emplace(dtype, std::vector<int64_t>{rows * cols});
  TensorView v = c->view();
  v.shape = {rows, cols};
  v.strides = {};
  return v;
}
// The descales of `role`: f32 [1, H] for the quantizers (all H equal), [1] for fp8_gemm.
TensorView descale_view(Fp8LinearState& st, int role, int64_t heads, bool for_gemm) {
  const int64_t need = Fp8LinearState::roles * kMaxQuantizerHeads;
  if (!st.descales) st.descales.emplace(DType::f32, std::vector<int64_t>{need});
  TensorView v = st.descales->view();
  v.data = static_cast<float*>(v.data) + role * kMaxQuantizerHeads;
  v.shape = for_gemm ? std::vector<int64_t>{1} : std::vector<int64_t>{1, heads};
  v.strides = {};
  return v;
}

// x [rows, cols] -> the role's fp8 copy (transpose: [cols, rows]) and its descale (one for the
// whole tensor), dynamic or delayed.
TensorView quantize(Fp8LinearState& st, int role, const TensorView& x, DType fp8, bool transpose, const Fp8LinearOptions& opt) {
  const int64_t rows = x.shape[0], cols = x.shape[1], D = fp8_linear_quantizer_width(cols), H = cols / D;
  if (H > kMaxQuantizerHeads)
    throw Error(fmt::format("fp8_linear: {} columns are more than the quantizers take ({} x {})", cols, kMaxQuantizerHeads, D));
  const TensorView y = transpose ? copy_view(st, role, fp8, cols, rows) : copy_view(st, role, fp8, rows, cols);
  const TensorView x4 = fp8_linear_quantizer_view(x, D);
  // yᵀ [cols, rows] row-major is the transposing quantizer's [1, H, D, rows].
  TensorView y4 = y;
  if (transpose) {
    y4.shape = {1, H, D, rows};
    y4.strides = {};
  } else {
    y4 = fp8_linear_quantizer_view(y, D);
  }
  const TensorView d = descale_view(st, role, H, false);
  LaunchOptions lo;
  lo.stream = opt.stream;
  int& turn = st.turn[role];
  const int64_t chunks = H * attention_fp8_quantize_chunks(H, rows);   // what chunk_amax writes: [1, H, C]
  if (opt.scaling == Fp8Scaling::delayed && st.primed[role]) {
    const TensorView prev = fp8_linear_all_chunks(st.amax[role][1 - turn]->view(), H, st.chunks[role]);
    quantize_fp8_delayed(x4, prev, y4, d, st.amax[role][turn], transpose, lo);
  } else {
    const TensorView mine = chunk_amaxes(x4, st.amax[role][turn], lo);   // grows the buffer: [1, H, C]
    quantize_with_chunk_amaxes(x4, fp8_linear_all_chunks(mine, H, chunks), y4, d, transpose, lo);
  }
  // This call's chunk amaxes are the next call's previous ones.
  st.chunks[role] = chunks;
  st.primed[role] = true;
  turn = 1 - turn;
  return y;
}

TensorView empty_bias(Fp8LinearState& st) {
  if (!st.no_bias) st.no_bias.emplace(DType::bf16, std::vector<int64_t>{8});
  TensorView v = st.no_bias->view();
  v.shape = {0};
  v.strides = {};
  return v;
}

}  // namespace

int64_t fp8_linear_quantizer_width(int64_t cols) {
  for (int64_t d : {128, 64, 32, 16})
    if (cols % d == 0) return d;
  throw Error(fmt::format("fp8_linear: {} columns are not a multiple of 16", cols));
}

TensorView fp8_linear_quantizer_view(const TensorView& t, int64_t D) {
  const std::vector<int64_t> s = t.effective_strides();
  TensorView v = t;
  v.shape = {1, t.shape[1] / D, t.shape[0], D};
  v.strides = {t.shape[0] * s[0], D * s[1], s[0], s[1]};
  return v;
}

TensorView fp8_linear_all_chunks(const TensorView& amaxes, int64_t heads, int64_t count) {
  if (amaxes.numel() < count)
    throw Error(fmt::format("internal error: fp8_linear: {} chunk amaxes where {} are needed", amaxes.numel(), count));
  TensorView v = amaxes;
  v.shape = {1, heads, count};
  v.strides = {0, 0, 1};
  return v;
}

std::optional<std::string> fp8_linear_fallback_reason(int64_t M, int64_t N, int64_t K) {
  for (auto [name, v] : {std::pair{"M", M}, std::pair{"N", N}, std::pair{"K", K}})
    if (v % 16 != 0)
      return fmt::format("{} = {} is not a multiple of 16 (FP8 wgmma reads K-major tiles of 16 elements, and every dim is "
                         "some product's K)",
                         name, v);
  return std::nullopt;
}

void fp8_linear_forward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& bias, const TensorView& y,
                        const Fp8LinearOptions& opt, Fp8LinearState& st) {
  check_matrix(x, "x", true);
  check_matrix(w, "w", true);
  check_matrix(y, "y", false);
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  if (w.shape[1] != K || y.shape != std::vector<int64_t>{M, N} || w.dtype != x.dtype)
    throw Error(fmt::format("fp8_linear: x [M, K] {}, w [N, K] {} and y [M, N] {} do not fit (x and w of one dtype)",
                            x.describe(), w.describe(), y.describe()));
  if (bias && (bias->rank() != 1 || bias->shape[0] != N || bias->dtype != x.dtype || bias->device != Device::cuda))
    throw Error(fmt::format("fp8_linear: bias must be [N] = [{}] of x's dtype on the GPU, got {}", N, bias->describe()));
  if (const auto why = fp8_linear_fallback_reason(M, N, K)) {
    say_fallback_once(M, N, K, *why);
    launch(linear_bf16(), {x, w, bias ? *bias : empty_bias(st), y}, fallback_options(M, N, K, opt.stream));
    return;
  }
  const TensorView xq = quantize(st, Fp8LinearState::x, x, DType::e4m3, false, opt);
  const TensorView wq = quantize(st, Fp8LinearState::w, w, DType::e4m3, false, opt);
  LaunchOptions lo;
  lo.stream = opt.stream;
  launch(fp8_gemm(),
         {xq, wq, descale_view(st, Fp8LinearState::x, 1, true), descale_view(st, Fp8LinearState::w, 1, true), bias ? *bias : empty_bias(st),
          y},
         lo);
}

void fp8_linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& dx,
                         const TensorView& dw, const Fp8LinearOptions& opt, Fp8LinearState& st) {
  check_matrix(dy, "dy", true);
  check_matrix(x, "x", true);
  check_matrix(w, "w", true);
  check_matrix(dx, "dx", false);
  check_matrix(dw, "dw", false);
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  if (w.shape[1] != K || dy.shape != std::vector<int64_t>{M, N} || dx.shape != x.shape || dw.shape != w.shape ||
      w.dtype != x.dtype || dy.dtype != x.dtype)
    throw Error(fmt::format("fp8_linear backward: dy [M, N] {}, x [M, K] {}, w [N, K] {}, dx {} and dw {} do not fit (dy, x "
                            "and w of one dtype)",
                            dy.describe(), x.describe(), w.describe(), dx.describe(), dw.describe()));
  if (const auto why = fp8_linear_fallback_reason(M, N, K)) {
    say_fallback_once(M, N, K, *why);
    const LaunchOptions lo = fallback_options(M, N, K, opt.stream);
    launch(linear_bf16_dx(), {dy, w, dx}, lo);
    launch(linear_bf16_dw(), {dy, x, dw}, lo);
    return;
  }
  using S = Fp8LinearState;
  const TensorView dyq = quantize(st, S::dy, dy, DType::e5m2, false, opt);    // [M, N]
  const TensorView wt = quantize(st, S::wt, w, DType::e4m3, true, opt);       // [K, N]
  const TensorView dyt = quantize(st, S::dyt, dy, DType::e5m2, true, opt);    // [N, M]
  const TensorView xt = quantize(st, S::xt, x, DType::e4m3, true, opt);       // [K, M]
  LaunchOptions lo;
  lo.stream = opt.stream;
  launch(fp8_gemm(), {dyq, wt, descale_view(st, S::dy, 1, true), descale_view(st, S::wt, 1, true), empty_bias(st), dx}, lo);
  launch(fp8_gemm(), {dyt, xt, descale_view(st, S::dyt, 1, true), descale_view(st, S::xt, 1, true), empty_bias(st), dw}, lo);
}

}  // namespace tj::kernels
