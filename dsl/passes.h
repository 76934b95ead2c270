#pragma once
// IR passes that every backend relies on.
#include "dsl/ir.h"

namespace tj::passes {

// Marks the outermost perfectly nested loops whose bounds are known before the kernel
// starts (defined at the top level) as launch loops: they become the launch grid.
void mark_launch_loops(ir::Function& f);

// Throws DslError at the offending op when the IR breaks a rule (types, scoping, launch
// structure). Tracing already checks most of this as ops are created; the verifier is
// the contract for IR that passes produce.
void verify(const ir::Function& f);

}  // namespace tj::passes
