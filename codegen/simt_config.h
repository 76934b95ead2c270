#pragma once
// The SIMT path's untuned config for streaming kernels: kernels without dots and without rank-2
// tiles (elementwise maps, reductions along rows that a grid walks: softmax, norms, amax and
// quantize passes). They are memory bound, and what decides their speed is the bytes a thread
// has in flight and the trips a row takes, so the config gives:
//   - each tunable block the width of its loop (the next power of two), at most 4096 in kernels
//     that reduce and 1024 in the others (1024 where the extent is known only at run time): a row
//     of up to 4096 columns in one trip, which the SIMT path keeps in registers between a
//     kernel's passes over it (Emitter::single_trip); a later pass that loads In tensors no
//     earlier pass loaded (LayerNorm's w and b) takes at most 1024 (the row read again from L2);
//   - num_warps for kernels that reduce: enough that a thread holds at most 32 elements of the
//     row tiles one trip of a loop loads (its block times the In tensors it loads as tiles,
//     rounded up to a power of two; the most over the loops), 2 to 8; 4 for the others (fewer
//     where the narrowest such block has fewer elements than the threads);
//   - simt_vec: adjacent elements per thread filling 16 bytes of the widest element the kernel
//     loads or stores, no more than the narrowest block leaves each thread.
// The measurements behind these choices are beside the constants in simt_config.cpp; blocks of 64
// on 4 warps, 1 element a thread (the generic default) run about 5x slower (H100, softmax).
#include <optional>

#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// The config above for a streaming kernel; nothing for other kernels (dots, rank-2 tiles) or
// kernels without a tunable block.
std::optional<Config> simt_streaming_config(const ir::Function& f);

}  // namespace tj::codegen
