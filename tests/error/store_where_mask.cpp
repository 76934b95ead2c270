// A store_where mask must be a comparison (a boolean tile); a float tile is reported at the user's line.
// EXPECT: store_where_mask.cpp:13:[0-9]+: error: store_where into 'o': the mask is a f32 tile; it must be boolean \(a comparison\)
#include "error_program.h"

using namespace tj;

int main() {
  return run_expecting_error([] {
    Kernel k = kernel("relu_copy", {"x", "o"}, [](In x, Out o) {
      auto [M, N] = x.shape<2>();
      for (auto m : tile(M, block("m"))) {
        auto t = x.load(m, all);
        o.store_where(t, m, all,
                      t);
      }
    });
    k.trace({TensorSpec{DType::f32, {64, 32}}, TensorSpec{DType::f32, {64, 32}}});
  });
}
