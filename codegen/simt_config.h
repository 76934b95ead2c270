#pragma once
// The SIMT path's untuned config for streaming kernels: kernels without dots and without rank-2
// tiles (elementwise maps, reductions along rows that a grid walks: softmax, norms, amax and
// quantize passes). They are memory bound, and what decides their speed is the bytes a thread
// has in flight and the trips a row takes, so the config gives:
//   - each tunable block the width of its loop (the next power of two), at most 1024 (1024 where
//     the extent is known only at run time): a row of up to 1024 columns in one trip, which the
//     SIMT path keeps in registers between a kernel's passes over it (Emitter::single_trip);
//   - num_warps 2 for kernels that reduce, 4 for the others (fewer where the narrowest such block
//     has fewer elements than the threads);
//   - simt_vec: adjacent elements per thread filling 16 bytes of the widest element the kernel
//     loads or stores, no more than the narrowest block leaves each thread.
// H200, RMSNorm bf16 [16384, 4096], same run: blocks of 1024 on 2 warps 0.078 ms (88% of a copy
// of the same bytes), on 4 warps 0.089 ms, whole rows of 4096 on 8 warps 0.089 ms; blocks of 64
// on 4 warps, 1 element a thread (the generic default) about 5x slower (H100, softmax). An add
// (no reduction) runs at a copy's speed on 4 warps, 91% on 2.
#include <optional>

#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// The config above for a streaming kernel; nothing for other kernels (dots, rank-2 tiles) or
// kernels without a tunable block.
std::optional<Config> simt_streaming_config(const ir::Function& f);

}  // namespace tj::codegen
