#pragma once
// The kernel library, written in the DSL. Each kernel is traced per specialization (dtypes,
// static shapes, host flags) and compiled on first use.
#include <optional>
#include <string>
#include <vector>

#include "dsl/kernel.h"

namespace tj::kernels {

// out[i] = x[i] + y[i] over a 1-D tensor.
const Kernel& vector_add();

// out[r, :] = softmax(x[r, :]) along the last dim, online max/sum in exp2
// (exp(x) = exp2(x · log2 e)), any number of columns.
const Kernel& softmax();

// o = softmax(q kᵀ · scale) v per (batch, head); q [B, H, Sq, D], k/v [B, H, Skv, D],
// o [B, H, Sq, D]. `scale` already includes log2(e). Causal masks keys after the query
// (aligned at the top-left). A plain tiled loop; tensor-core lowering is the compiler's job.
const Kernel& attention();

// A problem to run a library kernel on, as the CLI and tests describe it.
struct Problem {
  DType dtype = DType::f32;                  // input element type
  std::optional<DType> out_dtype;            // default: dtype (bf16 for fp8 inputs)
  std::vector<int64_t> shape;                // empty: the entry's default shape
  bool causal = false;
};

// Every library kernel by name, for the CLI and for tests that compile them all.
struct LibraryEntry {
  std::string name;
  const Kernel& (*get)();
  std::string summary;
  std::vector<int64_t> default_shape;
  // The kernel's arguments for `p`: tensor specs, runtime scalars and host values.
  std::vector<ArgSpec> (*arguments)(const Problem& p);
  double (*flops)(const Problem& p);         // useful floating-point work, for TFLOP/s
};
const std::vector<LibraryEntry>& library();
const LibraryEntry& find(const std::string& name);   // throws tj::Error listing the names

}  // namespace tj::kernels
