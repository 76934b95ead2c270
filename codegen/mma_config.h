#pragma once
// The generic tensor-core lowering's untuned config: what codegen::untuned_config gives a kernel
// with dots that no registered lowering or library kernel configures itself (lowering.h).
#include <optional>

#include "codegen/target.h"
#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// For a kernel whose dots fit the tensor cores of `t`. wgmma (sm_90a): two warpgroups of 64
// accumulator rows each (8 warps), 256-column tiles where the columns are a launch loop's
// (GEMM-like), 128 where a loop inside the program steps over them (attention-like), K steps of
// 128 bytes, and as many pipeline stages (up to 4) as the shared memory holds; persistent blocks
// and raster groups of 8 where every program does the same work (no loop bound depends on the
// program). mma.sync (sm_80, sm_89, sm_90): 128 x 128 tiles on 8 warps (GEMM-like) or 64 x 64 on
// 4 (attention-like), K steps of 64 bytes, raster groups of 8 where the work is uniform. Both
// narrow the widest dot's columns until the accumulators take at most 160 registers a thread.
// Nothing for other kernels.
std::optional<Config> mma_default_config(const ir::Function& f, const Target& t);

}  // namespace tj::codegen
