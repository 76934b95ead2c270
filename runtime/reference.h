#pragma once
// The CPU reference executor: interprets any verified IR function on host tensors, exactly
// as dsl/SEMANTICS.md specifies. It is the oracle that generated GPU code is tested against
// and a debugger for kernels (ReferenceOptions::trace).
//
// Numerics: values are dense row-major arrays held in double, but every result is rounded
// to its dtype exactly as the GPU does: f32 results to float after each op (computing
// + - * / sqrt in double and rounding once to float is exact), f16/bf16 arithmetic in f32
// then rounded (round to nearest even), casts through tj::numerics (fp8 satfinite).
// exp2/log2/exp/log/tanh use the C library's float functions; rsqrt is 1/sqrt rounded once.
// reduce/dot accumulate in float, one rounding per add, positions in ascending order (dot:
// out = acc, then out += a[m,k]*b[k,n] for k = 0, 1, ...; each product rounded to f32).
// maximum/minimum (and max/min reductions) return the other operand when one is NaN
// (IEEE maxNum, as CUDA fmaxf and PTX max.f32). Integers: i32 results wrap to 32 bits, i64
// arithmetic wraps; integer values must stay within +-2^53 (they are held in double).
// Integer division or modulo by zero throws tj::Error at the op's source line.
// float -> int casts truncate toward zero and saturate, NaN -> 0 (PTX cvt.rzi.sat).
//
// Loads give 0 and stores skip elements outside the tensor; a store's value may be a scalar
// (tracing emits `y.store(t, 0.0)` that way) or exactly the slice's shape.
//
// Programs of the launch nest run one after another (program p: coordinates in row-major
// order of LaunchShape::extents, the outermost launch loop varying slowest); non-launch
// loops run sequentially inside a program.
#include <cstdint>
#include <variant>
#include <vector>

#include "dsl/config.h"
#include "dsl/ir.h"
#include "runtime/tensor.h"

namespace tj {

// One launch argument, in the order of Function::params: a tensor (host memory for
// run_reference; any device for launch_shape) or a runtime scalar.
using ArgValue = std::variant<TensorView, float>;

// The launch grid of a function for given arguments: one extent per launch loop
// (outermost first; a grid loop gives end - begin points, a tile loop cdiv(end - begin,
// block); negative extents count as 0), and their product (1 when there is no launch loop).
struct LaunchShape {
  std::vector<int64_t> extents;
  int64_t programs = 1;
};

struct ReferenceOptions {
  // Print each op's result (shape, min/max, NaN and inf counts) to std::cerr as it runs.
  bool trace = false;
  // With `trace`: the program to trace (-1: all programs). Ops run once per loop iteration,
  // so a trace of every program of a large launch is long.
  int64_t trace_program = 0;
};

// Checks `args` against the parameters of `f` (count, tensor or scalar, dtype, rank,
// static dims, strides; with `require_host`, host memory and non-null data) and throws
// tj::Error naming the parameter, e.g. "kernel 'attention': argument 'q': expected bf16, got f32".
void check_arguments(const ir::Function& f, const std::vector<ArgValue>& args, bool require_host);

// Evaluates the bounds of the launch loops from tensor dims, runtime scalars and the
// config's block sizes. Reads only shapes, so device tensors work. Validates the arguments
// (not their device).
LaunchShape launch_shape(const ir::Function& f, const Config& cfg, const std::vector<ArgValue>& args);

// Runs every program of `f` on the host. Output tensors are written in place (only the
// elements that the kernel stores); inputs are never written.
void run_reference(const ir::Function& f, const Config& cfg, const std::vector<ArgValue>& args,
                   const ReferenceOptions& options = {});

}  // namespace tj
