#pragma once
// The asynchronous schedule of a kernel's tensor-core dots: where the emitter waits for wgmma
// groups and where it releases the shared-memory slots their operands were staged in.
//
// mma.sync dots complete where they stand: for them the plan holds only the in-place
// accumulation below. Each wgmma dot is one commit group, issued where the dot stands. Its result is
// pending until a wait<n> (wgmma.wait_group n: all but the n newest groups complete). A dot
// whose result is only written to a variable accumulates in that variable's registers in
// place, so a chain of such dots (acc = dot(a, b, acc) in a K loop) waits for nothing. Waits
// come:
//   - before an op that reads a pending result (the softmax of S; the epilogue of a GEMM; an
//     operand written into a shared-memory buffer), for exactly the groups it needs;
//   - before a dot with wgmma's register A operand, for every pending group: its fragments are
//     made by the threads where it stands, and ptxas serializes all of a kernel's wgmmas (C7513)
//     when one's register inputs are defined while other groups are in flight;
//   - at the end of a loop body, for the previous iteration's groups (one iteration's dots stay
//     in flight while the next iteration's are issued);
//   - at the exit of a loop whose dots read staged slots, and before a loop when anything is
//     pending (loops start and end with nothing in flight that they do not own).
// A staged load's slot (its use in one iteration of its home loop, or in one program for a load
// outside any loop inside the program) is released once every reader of that use has completed:
// its last reader's group, or the loop holding its last reader, at that loop's exit. (A block
// that loops over programs, knob persistent, fills those slots again for its next program.)
#include <map>
#include <vector>

#include "codegen/mma_plan.h"
#include "dsl/ir.h"

namespace tj::codegen {

struct AsyncPlan {
  struct Release {
    int staged = -1;          // MmaPlan::staged index
    bool previous = false;    // the use of the home loop's previous iteration (none in its first)
  };
  struct Wait {
    int pending = -1;                        // wgmma_wait<pending>; -1: no wait
    std::vector<const ir::Op*> completed;    // dots whose groups are complete after it
    std::vector<Release> releases;           // slots released after it
    bool empty() const { return pending < 0 && releases.empty(); }
  };
  std::map<const ir::Op*, Wait> before;      // before an op
  std::map<const ir::Op*, Wait> after;       // right after an op (a loop: at its exit)
  std::map<const ir::Op*, Wait> body_end;    // keyed by a loop: at the end of its body
  // Tensor-core dots whose result is only written to a variable: they accumulate into its
  // registers (value: the variable's value id).
  std::map<const ir::Op*, int> in_place;
  // var_read ops whose every use is the accumulator of an in-place dot into the same variable:
  // they name the variable's registers and read nothing.
  std::map<const ir::Op*, int> alias_reads;
};

AsyncPlan plan_async(const ir::Function& f, const MmaPlan& mma);

}  // namespace tj::codegen
