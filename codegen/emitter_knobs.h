#pragma once
// The CUDA emitter's knobs (the SIMT path and the generic tensor-core lowering): one table, read
// by codegen/cuda_emitter.cpp, codegen/layout.cpp, codegen/mma_plan.cpp and codegen/lowering.cpp.
#include "codegen/knob.h"

namespace tj::codegen::knobs {

extern const KnobSpec lowering;           // 0: skip the pattern lowerings
extern const KnobSpec mma;                // 0: every dot on the SIMT path
extern const KnobSpec warp_specialize;    // the producer warpgroup of the staged operands
extern const KnobSpec persistent;
extern const KnobSpec persistent_blocks;
extern const KnobSpec raster_group;
extern const KnobSpec longest_first;
extern const KnobSpec overlap;           // a loop's chained dot one iteration late
extern const KnobSpec wg_turns;          // the consumer warpgroups take turns issuing wgmmas
extern const KnobSpec wg_programs;       // programs a block runs at once, each on warps of its own
extern const KnobSpec stage_stores;      // accumulator-layout stores through shared memory
extern const KnobSpec copy_stages;       // fp8 operands copied K-major: slots of the copy's ring
extern const KnobSpec fp8_key_order;     // fp8 P.V: V's transposed copy in P's fragment order
extern const KnobSpec prefetch_program;  // persistent: program-level loads in two slots, the next program's ahead
extern const KnobSpec key_parity;        // fp8 P.V: K's rows (S's columns) by parity, P's fragments shuffle-free
extern const KnobSpec issue_early;       // loop bodies' input loads and leaf dots first (codegen/issue_early.h)
extern const KnobSpec prefetch_loads;    // small input loads one iteration ahead (codegen/prefetch_loads.h)
extern const KnobSpec mask_bounds;       // loops bounded by the tiles a mask keeps (codegen/mask_bounds.h)
extern const KnobSpec pin_waits;         // work before a wgmma wait kept above it in the SASS
extern const KnobSpec fast_math;
extern const KnobSpec simt_vec;
extern const KnobSpec simt_lanes_c;
extern const KnobSpec simt_warps_c;
extern const KnobSpec simt_min_blocks;

}  // namespace tj::codegen::knobs
