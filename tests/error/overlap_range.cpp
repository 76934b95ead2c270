// Knob overlap takes 0 (off), 1 (the late dot's accumulator prepared with the late dot) or 2
// (prepared at the end of the iteration before); anything else is an error that says so.
// EXPECT: kernel 'readme_attention': knob overlap is 0, 1 or 2, got 3
#include "error_program.h"

#include "examples/kernels/user_kernels.h"

int main() {
  return run_expecting_error([] {
    const tj::TensorSpec x{tj::DType::bf16, {1, 2, 256, 64}};
    const tj::ir::Function f = tj::examples::readme_attention().trace({x, x, x, x, tj::RuntimeScalar{0.125f}, false});
    tj::codegen::generate_cuda(f, tj::Config::from_json(R"({"blocks":{"m":128,"n":128},"num_warps":8,"knobs":{"overlap":3}})"),
                               tj::codegen::Target::parse("sm_90a"));
  });
}
