#include "kernels/library.h"

namespace tj::kernels {

const Kernel& vector_add() {
  static const Kernel k = kernel("vector_add", {"x", "y", "out"}, [](In x, In y, Out out) {
    for (auto i : tile(x.dim(0), block("n"))) out.store(i, x.load(i) + y.load(i));
  });
  return k;
}

const Kernel& softmax() {
  static const Kernel k = kernel("softmax", {"x", "out"}, [](In x, Out out) {
    constexpr double log2e = 1.4426950408889634;
    auto [rows, cols] = x.shape<2>();
    for (auto r : grid(rows)) {
      Var m_i = constant(-INFINITY, DType::f32);
      Var l_i = constant(0.0, DType::f32);
      for (auto c : tile(cols, block("c"))) {             // pass 1: running max and sum
        auto s = x.load(r, c).to(DType::f32) * log2e;
        auto m_new = maximum(m_i, amax(s, 0));
        l_i = l_i * exp2(m_i - m_new) + sum(exp2(s - m_new), 0);
        m_i = m_new;
      }
      for (auto c : tile(cols, block("c2"))) {            // pass 2: normalize
        auto s = x.load(r, c).to(DType::f32) * log2e;
        out.store(r, c, (exp2(s - m_i) / l_i).to(out.dtype()));
      }
    }
  });
  return k;
}

}  // namespace tj::kernels
