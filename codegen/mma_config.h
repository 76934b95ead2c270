#pragma once
// The generic tensor-core lowering's untuned config: what codegen::untuned_config gives a kernel
// with dots that no registered lowering or library kernel configures itself (lowering.h).
#include <optional>

#include "codegen/target.h"
#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// For a kernel whose dots fit wgmma on `t`: two warpgroups of 64 accumulator rows each (8 warps),
// 256-column tiles where the columns are a launch loop's (GEMM-like), 128 where a loop inside the
// program steps over them (attention-like), K steps of 128 bytes, and as many pipeline stages (up
// to 4) as the shared memory holds; persistent blocks and raster groups of 8 where every program
// does the same work (no loop bound depends on the program). Nothing for other kernels and targets.
std::optional<Config> mma_default_config(const ir::Function& f, const Target& t);

}  // namespace tj::codegen
