// A knob out of its range is an error that gives the range.
// EXPECT: kernel 'swiglu': knob raster_group must be in \[1, 64\] \(1: off\), got 0
#include "error_program.h"

#include "examples/kernels/user_kernels.h"

int main() {
  return run_expecting_error([] {
    const tj::TensorSpec x{tj::DType::bf16, {256, 256}};
    const tj::ir::Function f = tj::examples::swiglu().trace({x, x, x, x});
    tj::codegen::generate_cuda(f, tj::Config::from_json(R"({"num_warps":8,"knobs":{"raster_group":0}})"),
                               tj::codegen::Target{});
  });
}
