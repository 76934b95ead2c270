#include "kernels/library.h"

#include <fmt/format.h>

#include <cmath>

#include "runtime/error.h"

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

std::vector<ArgSpec> attention_args(const Problem& p) {
  expect_rank(p, 4, "attention", "[batch, heads, seq, head_dim]");
  TensorSpec t{p.dtype, p.shape};
  double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(p.shape[3]));
  return {t, t, t, TensorSpec{out_type(p), p.shape}, RuntimeScalar{static_cast<float>(scale)}, p.causal};
}

double numel(const Problem& p) {
  double n = 1;
  for (int64_t d : p.shape) n *= static_cast<double>(d);
  return n;
}

}  // namespace

const std::vector<LibraryEntry>& library() {
  static const std::vector<LibraryEntry> entries = {
      {"vector_add", &vector_add, "out = x + y (1-D)", {1 << 20}, &vector_add_args, [](const Problem& p) { return numel(p); }},
      {"softmax", &softmax, "row softmax with online max/sum in exp2 (2-D)", {256, 1000}, &softmax_args,
       [](const Problem& p) { return 5 * numel(p); }},
      {"attention", &attention, "attention forward, online softmax, causal or not ([B, H, S, D])", {1, 2, 256, 64},
       &attention_args,
       [](const Problem& p) {
         double s = static_cast<double>(p.shape[2]);
         return 4.0 * numel(p) * s * (p.causal ? 0.5 : 1.0);
       }},
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
