#pragma once
// Issue order for the tensor-core lowerings (one pass): in every inner loop's body, the work that
// depends only on what the body reads from input tensors moves to the body's start, so that its
// latency overlaps the rest of the body instead of stalling where the user wrote it:
//   - loads of input tensors (tj::In) that are read by the threads (a row of LSEs, a mask's
//     ids): their global-memory latency then hides behind the body's first dots;
//   - "leaf" dots, whose operands are such loads, loop-invariant values and pure ops on them (dP =
//     dO.V^T in an attention backward, independent of the softmax before it): issued next to the
//     body's other leaf dots, their tensor-core work overlaps the elementwise work between them,
//     and the waits before their results' readers wait for fewer groups.
// The ops that compute their operands move with them; everything else keeps its order after
// them. Loads that only feed dots (staged through shared memory) move only with their dot: their
// position is where the consumer waits for the copy. Values are unchanged: inputs never share
// memory with outputs (checked at launch), and a variable's read never moves above a write of it.
#include "dsl/ir.h"

namespace tj::codegen {

// A copy of `f` with every non-launch loop body reordered as above. The CUDA emitter applies it
// to kernels with dots on targets with tensor cores (knob issue_early).
// `moved`, when given, says whether any op moved.
ir::Function issue_early(const ir::Function& f, bool* moved = nullptr);

}  // namespace tj::codegen
