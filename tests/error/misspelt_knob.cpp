// A config knob that no lowering reads is an error that names the closest one.
// EXPECT: the config sets knob 'presistent', which no lowering reads \(did you mean 'persistent'\?\)
#include "error_program.h"

int main() {
  return run_expecting_error([] {
    const tj::ir::Function f = tj::kernels::gemm().trace(
        {tj::TensorSpec{tj::DType::bf16, {256, 256}}, tj::TensorSpec{tj::DType::bf16, {256, 256}},
         tj::TensorSpec{tj::DType::bf16, {256, 256}}});
    tj::codegen::generate_cuda(f, tj::Config::from_json(R"({"knobs":{"presistent":1}})"), tj::codegen::Target{});
  });
}
