#pragma once
// What the IR fixes about its block symbols before the kernel runs: loop extents (the tuner's
// space of block sizes, the SIMT path's untuned config) and which blocks size rank-2 tiles (the
// limits check_config and the tuner put on them).
#include <cstdint>
#include <optional>
#include <vector>

#include "dsl/ir.h"

namespace tj::ir {

// fn(a, b) for integer scalar ops (+ - * div floordiv mod max min, Python's rounding for floordiv
// and mod), nothing for others or a zero divisor.
std::optional<int64_t> fold_binary(BinaryFn fn, int64_t a, int64_t b);

// The loop extent of each block symbol when it is a compile-time constant (end - begin of
// every tile loop that steps by it, the largest if several), else -1. Index: block id.
// Constants come from tracing, dims of static tensors and integer arithmetic on those.
std::vector<int64_t> constant_block_extents(const Function& f);

// Per block id: whether the block sizes a tile of rank 2 or more anywhere in `f`.
std::vector<bool> blocks_in_2d_tiles(const Function& f);

}  // namespace tj::ir
