// Storing a tile of another dtype is reported at the user's line, with the fix.
// EXPECT: store_dtype.cpp:13:[0-9]+: error: storing a f32 tile into 'o', which holds bf16: convert with \.to\(tj::DType::bf16\)
#include "error_program.h"

using namespace tj;

int main() {
  return run_expecting_error([] {
    Kernel k = kernel("scaled_copy", {"x", "o"}, [](In x, Out o) {
      auto [M, N] = x.shape<2>();
      for (auto m : tile(M, block("m"))) {
        auto t = x.load(m, all).to(DType::f32) * 2.0;
        o.store(m, all,
                t);
      }
    });
    k.trace({TensorSpec{DType::bf16, {64, 32}}, TensorSpec{DType::bf16, {64, 32}}});
  });
}
