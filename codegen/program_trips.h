#pragma once
// How many programs a launch runs and how long each runs: the trip counts of the loops inside it, where a loop's bounds depend on
// the program (causal attention's key loop ends where the query tile does; the backward's dK / dV
// query loop starts where the key tile does). For the untuned config (persistent blocks only where
// programs are short) and for knob longest_first (which way to walk a launch loop).
#include <optional>

#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// The launch grid's programs under config c where every launch loop's bounds are static, else nothing.
std::optional<int64_t> static_programs(const ir::Function& f, const Config& c);

// The most iterations of any loop inside the first or the last program along every launch loop
// (the longest program, where the trip counts change monotonically with the launch indices),
// under config c; nothing where some bound is not static.
std::optional<int64_t> longest_program_trips(const ir::Function& f, const Config& c);

// Which way the work of a program changes along launch loop `launch` (a loop op of f marked
// launch): +1 when the loops inside the program run more iterations the larger its index, -1
// fewer, 0 when none of their bounds depends on it. Where the bounds are static under c, the
// iterations of its first and last program (the other launch loops at their first) decide;
// else the shape of the bounds: -1 where only loops' begins depend on the index, +1 otherwise.
int trip_trend(const ir::Function& f, const Config& c, const ir::Op& launch);

}  // namespace tj::codegen
