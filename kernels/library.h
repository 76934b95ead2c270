#pragma once
// The kernel library, written in the DSL. Each kernel is traced per specialization (dtypes,
// static shapes, host flags) and compiled on first use.
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

// Every library kernel by name, for the CLI and for tests that compile them all.
struct LibraryEntry {
  std::string name;
  const Kernel& (*get)();
  std::string summary;
};
const std::vector<LibraryEntry>& library();
const Kernel& find(const std::string& name);   // throws tj::Error listing the names

}  // namespace tj::kernels
