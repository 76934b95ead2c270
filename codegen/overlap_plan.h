#pragma once
// Knob overlap: FA3's intra-warpgroup overlap as a schedule any loop gets, not a property of one
// kernel. In a loop whose body issues a first wgmma dot (S = Q.K^T) and ends with a chained one
// that accumulates into a loop-carried variable (acc = dot(P, V, acc * alpha)), the chained dot
// and the ops that only feed it (the "late" ops: the rescale acc * alpha, V's slot) run one
// iteration late: iteration j issues its first dot, then the late ops of iteration j - 1, and its
// elementwise work (the softmax of S_j) runs while the chained dot of j - 1 is on the tensor
// cores. The values the late ops read from the rest of the body are carried over the back edge
// in registers (P as wgmma's A fragments, alpha as a row vector); after the loop the last
// iteration's late ops run once more.
//
// The plan only says which ops are late and what is carried; codegen/emit_overlap.cpp emits it.
// Where a loop does not qualify, `why` says what stands in the way (shown in the generated code).
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/async_plan.h"
#include "codegen/mma_plan.h"
#include "dsl/ir.h"

namespace tj::codegen {

struct OverlapLoop {
  const ir::Op* first = nullptr;     // the body's first dot: issued before the late ops
  const ir::Op* chained = nullptr;   // the body's last dot, in place into variable `acc_var`
  int acc_var = -1;
  std::set<const ir::Op*> late;      // run one iteration late (chained included)
  int fragment = -1;                 // chained's register A operand: carried as A fragments
  std::vector<int> carried;          // other values of the body the late ops read, carried as is
  std::string why;                   // non-empty: the loop does not qualify
};

// `mma`: the plan with the emitter's folds applied (a dot's operand values are what it reads).
// `slots(v)`: registers a thread holds of value v (0 for a scalar).
OverlapLoop plan_overlap(const ir::Function& f, const ir::Op& loop, const MmaPlan& mma, const AsyncPlan& async,
                         const std::function<int(int)>& slots);

}  // namespace tj::codegen
