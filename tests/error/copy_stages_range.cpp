// Knob copy_stages (slots of an fp8 operand's K-major copy) takes at least 1; 0 is an error that
// says so.
// EXPECT: kernel 'readme_attention': knob copy_stages must be at least 1, got 0
#include "error_program.h"

#include "examples/kernels/user_kernels.h"

int main() {
  return run_expecting_error([] {
    const tj::TensorSpec x{tj::DType::e4m3, {1, 2, 256, 128}}, o{tj::DType::bf16, {1, 2, 256, 128}};
    const tj::ir::Function f = tj::examples::readme_attention().trace({x, x, x, o, tj::RuntimeScalar{0.125f}, false});
    tj::codegen::generate_cuda(f, tj::Config::from_json(R"({"blocks":{"m":128,"n":128},"num_warps":8,"knobs":{"copy_stages":0}})"),
                               tj::codegen::Target::parse("sm_90a"));
  });
}
