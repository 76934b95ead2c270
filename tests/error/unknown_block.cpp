// A config that sizes a block the kernel does not have names the kernel's blocks.
// EXPECT: config sets block 'q', but kernel 'gemm' has blocks: m, n, k
#include "error_program.h"

int main() {
  return run_expecting_error([] {
    const tj::ir::Function f = tj::kernels::gemm().trace(
        {tj::TensorSpec{tj::DType::bf16, {256, 256}}, tj::TensorSpec{tj::DType::bf16, {256, 256}},
         tj::TensorSpec{tj::DType::bf16, {256, 256}}});
    tj::check_config(f, tj::Config::from_json(R"({"blocks":{"q":64}})"));
  });
}
