#include "kernels/library.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace tj::kernels {

namespace {

DType out_type(const Problem& p) { return p.out_dtype.value_or(is_fp8(p.dtype) ? DType::bf16 : p.dtype); }

void expect_rank(const Problem& p, size_t rank, const char* kernel, const char* dims) {
  if (p.shape.size() != rank)
    throw Error(fmt::format("{} takes a rank-{} shape {}, got [{}]", kernel, rank, dims, fmt::join(p.shape, ", ")));
  for (int64_t d : p.shape)
    if (d <= 0) throw Error(fmt::format("{}: every dimension must be positive, got [{}]", kernel, fmt::join(p.shape, ", ")));
}

std::vector<ArgSpec> vector_add_args(const Problem& p) {
  expect_rank(p, 1, "vector_add", "[n]");
  TensorSpec t{p.dtype, p.shape};
  return {t, t, TensorSpec{out_type(p), p.shape}};
}

std::vector<ArgSpec> softmax_args(const Problem& p) {
  expect_rank(p, 2, "softmax", "[rows, cols]");
  return {TensorSpec{p.dtype, p.shape}, TensorSpec{out_type(p), p.shape}};
}

// rmsnorm / layernorm ([rows, cols]): weights (and layernorm's bias) [cols] of x's type.
std::vector<ArgSpec> norm_args(const Problem& p, bool with_bias) {
  expect_rank(p, 2, with_bias ? "layernorm" : "rmsnorm", "[rows, cols]");
  TensorSpec w{p.dtype, {p.shape[1]}};
  std::vector<ArgSpec> out = {TensorSpec{p.dtype, p.shape}, w};
  if (with_bias) out.push_back(w);
  out.push_back(TensorSpec{out_type(p), p.shape});
  out.push_back(RuntimeScalar{1e-5f});
  return out;
}
std::vector<ArgSpec> rmsnorm_args(const Problem& p) { return norm_args(p, false); }
std::vector<ArgSpec> layernorm_args(const Problem& p) { return norm_args(p, true); }

std::vector<ArgSpec> attention_args(const Problem& p) {
  expect_rank(p, 4, "attention", "[batch, heads, seq, head_dim]");
  TensorSpec t{p.dtype, p.shape};
  double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(p.shape[3]));
  return {t, t, t, TensorSpec{out_type(p), p.shape}, RuntimeScalar{static_cast<float>(scale)}, p.causal};
}

// fp8_gemm's inputs: e4m3 unless --dtype says e5m2 (then b is e5m2: the e4m3 x e5m2 mix);
// the CLI's default f32 means e4m3.
std::vector<ArgSpec> fp8_gemm_args(const Problem& p) {
  expect_rank(p, 3, "fp8_gemm", "[M, N, K]");
  if (!is_fp8(p.dtype) && p.dtype != DType::f32)
    throw Error(fmt::format("fp8_gemm takes e4m3 or e5m2 inputs, not {} (the gemm kernel takes 16-bit inputs)", name(p.dtype)));
  const int64_t M = p.shape[0], N = p.shape[1], K = p.shape[2];
  const DType b_type = p.dtype == DType::e5m2 ? DType::e5m2 : DType::e4m3;
  return {TensorSpec{DType::e4m3, {M, K}}, TensorSpec{b_type, {N, K}}, TensorSpec{DType::f32, {1}},
          TensorSpec{DType::f32, {1}},     TensorSpec{DType::f32, {0}},   TensorSpec{p.out_dtype.value_or(DType::bf16), {M, N}}};
}

std::vector<ArgSpec> gemm_args(const Problem& p) {
  expect_rank(p, 3, "gemm", "[M, N, K]");
  const int64_t M = p.shape[0], N = p.shape[1], K = p.shape[2];
  return {TensorSpec{p.dtype, {M, K}}, TensorSpec{p.dtype, {N, K}}, TensorSpec{out_type(p), {M, N}}};
}

double gemm_flops(const Problem& p) {
  return 2.0 * static_cast<double>(p.shape[0]) * static_cast<double>(p.shape[1]) * static_cast<double>(p.shape[2]);
}

// attention_fp8 ([B, H, S, D]): fp8 inputs take V transposed ([B, H, D, S rounded up to 16]).
std::vector<ArgSpec> attention_fp8_args(const Problem& p) {
  expect_rank(p, 4, "attention_fp8", "[batch, heads, seq, head_dim]");
  const int64_t B = p.shape[0], H = p.shape[1], S = p.shape[2], D = p.shape[3];
  TensorSpec t{p.dtype, p.shape};
  TensorSpec v = is_fp8(p.dtype) ? TensorSpec{p.dtype, {B, H, D, (S + 15) / 16 * 16}} : t;
  TensorSpec ds{DType::f32, {B, H}};
  double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(D));
  return {t, t, v, ds, ds, ds, TensorSpec{out_type(p), p.shape}, TensorSpec{DType::f32, {B, H, S}},
          RuntimeScalar{static_cast<float>(scale)}, RuntimeScalar{1.0f}, p.causal, true};
}

// quantize_fp8 / quantize_transpose_fp8 ([B, H, S, D]; --dtype is x's type, --out-dtype the fp8 type).
std::vector<ArgSpec> quantize_args(const Problem& p, bool transpose) {
  expect_rank(p, 4, transpose ? "quantize_transpose_fp8" : "quantize_fp8", "[batch, heads, seq, head_dim]");
  const int64_t B = p.shape[0], H = p.shape[1], S = p.shape[2], D = p.shape[3];
  DType q = p.out_dtype && is_fp8(*p.out_dtype) ? *p.out_dtype : DType::e4m3;
  TensorSpec y = transpose ? TensorSpec{q, {B, H, D, (S + 15) / 16 * 16}} : TensorSpec{q, p.shape};
  return {TensorSpec{p.dtype, p.shape}, y, TensorSpec{DType::f32, {B, H}}};
}

// The rotating / splitting quantizers ([B, H, S, D]; --dtype is x's type, --out-dtype the fp8
// type): rotation f32 [D, D] (random from the CLI: any matrix exercises the kernel; the pipeline
// passes a Hadamard), y [B, H, S, D] or, split, [B, H, S, 2, D]; split ones rotate too.
std::vector<ArgSpec> rotate_quantize_args(const Problem& p, const char* kernel, bool split) {
  expect_rank(p, 4, kernel, "[batch, heads, seq, head_dim]");
  const int64_t B = p.shape[0], H = p.shape[1], S = p.shape[2], D = p.shape[3];
  DType q = p.out_dtype && is_fp8(*p.out_dtype) ? *p.out_dtype : DType::e4m3;
  // A 16-bit x takes its rotation in its own dtype (the product on the tensor cores).
  const DType r = p.dtype == DType::bf16 || p.dtype == DType::f16 ? p.dtype : DType::f32;
  TensorSpec x{p.dtype, p.shape}, rotation{r, {D, D}}, descale{DType::f32, {B, H}};
  if (!split) return {x, rotation, TensorSpec{q, p.shape}, descale};
  return {x, rotation, TensorSpec{q, {B, H, S, 2, D}}, descale, true};
}

double numel(const Problem& p) {
  double n = 1;
  for (int64_t d : p.shape) n *= static_cast<double>(d);
  return n;
}

// Two passes, each rotating (2·D flops per element), plus the scaling.
double rotate_quantize_flops(const Problem& p) { return (4.0 * static_cast<double>(p.shape[3]) + 3.0) * numel(p); }

// Args' specs with every tensor row-major, as launch() derives them for contiguous ones (their
// unit strides compiled in): what `tilejit show` prints and `tune` tunes is what runs.
template <std::vector<ArgSpec> (*Args)(const Problem&)>
std::vector<ArgSpec> laid_out(const Problem& p) {
  std::vector<ArgSpec> specs = Args(p);
  for (auto& s : specs)
    if (auto* t = std::get_if<TensorSpec>(&s)) *t = contiguous_spec(t->dtype, t->shape);
  return specs;
}
std::vector<ArgSpec> quantize_fp8_args(const Problem& p) { return quantize_args(p, false); }
std::vector<ArgSpec> quantize_transpose_fp8_args(const Problem& p) { return quantize_args(p, true); }
std::vector<ArgSpec> quantize_hadamard_fp8_args(const Problem& p) { return rotate_quantize_args(p, "quantize_hadamard_fp8", false); }
std::vector<ArgSpec> quantize_residual_fp8_args(const Problem& p) { return rotate_quantize_args(p, "quantize_residual_fp8", true); }
std::vector<ArgSpec> quantize_duplicate_fp8_args(const Problem& p) { return rotate_quantize_args(p, "quantize_duplicate_fp8", true); }

}  // namespace

const std::vector<LibraryEntry>& library() {
  static const std::vector<LibraryEntry> entries = {
      {"vector_add", &vector_add, "out = x + y (1-D)", {1 << 20}, &laid_out<&vector_add_args>, [](const Problem& p) { return numel(p); }},
      {"softmax", &softmax, "row softmax with online max/sum in exp2 (2-D)", {256, 1000}, &laid_out<&softmax_args>,
       [](const Problem& p) { return 5 * numel(p); }},
      {"rmsnorm", &rmsnorm, "RMSNorm over rows with a weight, f32 math (2-D)", {256, 1000}, &laid_out<&rmsnorm_args>,
       [](const Problem& p) { return 4 * numel(p); }},
      {"layernorm", &layernorm, "LayerNorm over rows with a weight and a bias, f32 math (2-D)", {256, 1000},
       &laid_out<&layernorm_args>, [](const Problem& p) { return 8 * numel(p); }},
      {"attention", &attention, "attention forward, online softmax, causal or not ([B, H, S, D])", {1, 2, 256, 64},
       &laid_out<&attention_args>,
       [](const Problem& p) {
         double s = static_cast<double>(p.shape[2]);
         return 4.0 * numel(p) * s * (p.causal ? 0.5 : 1.0);
       }},
      {"fp8_gemm", &fp8_gemm,
       "c = (a·bᵀ)·scale_a·scale_b (+ bias): a [M,K] e4m3, b [N,K] e4m3 (e5m2 with --dtype e5m2), per-tensor scales, "
       "bf16 out ([M, N, K])",
       {512, 512, 512}, &laid_out<&fp8_gemm_args>, &gemm_flops},
      {"gemm", &gemm, "c = a·bᵀ: a [M,K], b [N,K] of --dtype (bf16 for tensor cores), fp32 accumulation ([M, N, K])",
       {512, 512, 512}, &laid_out<&gemm_args>, &gemm_flops},
      {"attention_fp8", &attention_fp8,
       "scaled FP8 attention forward (descales per (b, h), P offset, V transposed; bf16/f16 too) ([B, H, S, D])",
       {1, 2, 256, 64}, &laid_out<&attention_fp8_args>,
       [](const Problem& p) {
         double s = static_cast<double>(p.shape[2]);
         return 4.0 * numel(p) * s * (p.causal ? 0.5 : 1.0);
       }},
      {"quantize_fp8", &quantize_fp8, "per-(b, h) amax -> descale, x -> e4m3 ([B, H, S, D])", {1, 2, 256, 64},
       &laid_out<&quantize_fp8_args>, [](const Problem& p) { return 3 * numel(p); }},
      {"quantize_transpose_fp8", &quantize_transpose_fp8, "quantize_fp8 writing the transpose [B, H, D, S_pad]",
       {1, 2, 256, 64}, &laid_out<&quantize_transpose_fp8_args>,
       [](const Problem& p) { return 3 * numel(p); }},
      {"quantize_hadamard_fp8", &quantize_hadamard_fp8,
       "x·R (R [D, D], a Hadamard in the pipeline) -> per-(b, h) descale, e4m3 ([B, H, S, D])", {1, 2, 256, 64},
       &laid_out<&quantize_hadamard_fp8_args>, &rotate_quantize_flops},
      {"quantize_residual_fp8", &quantize_residual_fp8,
       "x·R -> e4m3 hi and residual lo halves [B, H, S, 2, D], one descale per (b, h) ([B, H, S, D])", {1, 2, 256, 64},
       &laid_out<&quantize_residual_fp8_args>, &rotate_quantize_flops},
      {"quantize_duplicate_fp8", &quantize_duplicate_fp8,
       "x·R -> e4m3 in both halves [B, H, S, 2, D] (K for a residual Q) ([B, H, S, D])", {1, 2, 256, 64},
       &laid_out<&quantize_duplicate_fp8_args>, &rotate_quantize_flops},
  };
  return entries;
}

const LibraryEntry& find(const std::string& name) {
  std::string names;
  for (const auto& e : library()) {
    if (e.name == name) return e;
    names += (names.empty() ? "" : ", ") + e.name;
  }
  throw Error(fmt::format("no kernel named '{}' (library kernels: {})", name, names));
}

}  // namespace tj::kernels
