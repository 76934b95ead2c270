#pragma once
// Loads one iteration ahead (one pass): in every loop inside a program, a vector that the threads
// load from an input tensor at the loop's tile (an attention backward's LSE and delta for the
// query tile) is loaded for the next tile while this one runs, into a loop-carried variable:
//
//   var pre = load(x, begin)                 before the loop
//   for i:  cur = pre                        where the load was
//           pre = load(x, min(i + block, last))   (issue_early puts it at the body's start)
//
// so that its global-memory latency hides behind a whole iteration instead of the body's first
// dots. `last` is the last tile's start (begin + ((end - begin - 1) floordiv block) * block): the
// last iteration's extra load, never read, reloads the last tile instead of running past the
// loop, so that where the emitter's range analysis proves the loop's tiles whole the loads ahead
// need no bounds checks either (elsewhere they are masked like any tile load). Only rank-0/1
// tiles (a register or two a thread), indexed by the loop's own tile and loop-invariant values,
// that something other than a dot reads.
#include "dsl/ir.h"

namespace tj::codegen {

// A copy of `f` with such loads carried one iteration ahead; `moved`, when given, says whether
// any was. The CUDA emitter applies it before issue_early (knob prefetch_loads).
ir::Function prefetch_loads(const ir::Function& f, bool* moved = nullptr);

}  // namespace tj::codegen
