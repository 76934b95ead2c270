#pragma once
// Loop extents the IR fixes before the kernel runs: an analysis the tuner (the space of block
// sizes) and the SIMT path's untuned config both read.
#include <cstdint>
#include <vector>

#include "dsl/ir.h"

namespace tj::ir {

// The loop extent of each block symbol when it is a compile-time constant (end - begin of
// every tile loop that steps by it, the largest if several), else -1. Index: block id.
// Constants come from tracing, dims of static tensors and integer arithmetic on those.
std::vector<int64_t> constant_block_extents(const Function& f);

}  // namespace tj::ir
