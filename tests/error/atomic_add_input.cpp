// An atomic add into an input tensor (tj::In) is reported at the user's line.
// EXPECT: atomic_add_input.cpp:14:[0-9]+: error: 'acc' is an input \(tj::In\): declare it tj::Out or tj::InOut to add to it
#include "error_program.h"

using namespace tj;

int main() {
  return run_expecting_error([] {
    Kernel k = kernel("split_sum", {"x", "acc"}, [](In x, In acc) {
      auto [S, M, N] = x.shape<3>();
      for (auto s : grid(S)) {
        for (auto m : tile(M, block("m"))) {
          auto t = x.load(s, m, all);
          acc.atomic_add(m, all, t);
        }
      }
    });
    k.trace({TensorSpec{DType::f32, {4, 64, 32}}, TensorSpec{DType::f32, {64, 32}}});
  });
}
