// An atomic add into a 16-bit tensor is reported at the user's line, with what to do instead.
// EXPECT: atomic_add_dtype.cpp:14:[0-9]+: error: atomic_add into 'dq', which holds bf16: atomic adds take f32, i32 or i64 tensors \(add into an f32 tensor, then convert it in a second kernel\)
#include "error_program.h"

using namespace tj;

int main() {
  return run_expecting_error([] {
    Kernel k = kernel("split_sum", {"x", "dq"}, [](In x, Out dq) {
      auto [S, M, N] = x.shape<3>();
      for (auto s : grid(S)) {
        for (auto m : tile(M, block("m"))) {
          auto t = x.load(s, m, all);
          dq.atomic_add(m, all, t);
        }
      }
    });
    k.trace({TensorSpec{DType::bf16, {4, 64, 32}}, TensorSpec{DType::bf16, {64, 32}}});
  });
}
