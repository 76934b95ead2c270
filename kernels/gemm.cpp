// GEMMs written as plain tile loop nests. On sm_90a the code generator recognizes the nest
// (codegen/lower_gemm_sm90.cpp) and emits a warp-specialized TMA + wgmma pipeline whose
// epilogue is generated from the ops after the K loop; on sm_80 / sm_89 / sm_90 a cp.async +
// mma.sync pipeline with the same epilogue (codegen/lower_gemm_sm80.cpp; fp8 from sm_89);
// elsewhere the SIMT path runs it.
#include "kernels/library.h"

namespace tj::kernels {

namespace {

// A float32 scale that is either one value for the whole tensor (shape [1]) or one per
// position of the tile loop `t` (shape [extent]): a scalar, or a rank-1 tile along `t`.
// With static shapes the choice is made while tracing; with dynamic shapes at run time.
Tile scale_along(const In& s, const TileIndex& t) {
  auto d = s.static_dim(0);
  if (d && *d == 1) return s.load(0);                    // per tensor
  if (d) return s.load(t);                               // per row / per column
  return where(s.dim(0) == 1, s.load(0), s.load(t));     // decided at run time
}

}  // namespace

const Kernel& fp8_gemm() {
  static const Kernel k = kernel(
      "fp8_gemm", {"a", "b", "scale_a", "scale_b", "bias", "c"},
      [](In a, In b, In scale_a, In scale_b, In bias, Out c) {
        auto [M, K] = a.shape<2>();
        auto N = b.dim(0);
        for (auto m : tile(M, block("m"))) {
          for (auto n : tile(N, block("n"))) {
            Var acc = zeros({m, n}, DType::f32);
            for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(n, k).T(), acc);
            Tile sa = scale_along(scale_a, m), sb = scale_along(scale_b, n);
            if (sa.rank() == 1) sa = sa.col();                  // [m] -> [m, 1]
            Tile y = acc * (sa * sb);                           // sb: scalar or [n] (broadcasts as [1, n])
            if (bias.static_dim(0) != 0) y = y + bias.load(n);  // [N]; an empty bias adds nothing
            c.store(m, n, y.to(c.dtype()));
          }
        }
      });
  return k;
}

const Kernel& gemm() {
  static const Kernel k = kernel("gemm", {"a", "b", "c"}, [](In a, In b, Out c) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m"))) {
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(n, k).T(), acc);
        c.store(m, n, acc.to(c.dtype()));
      }
    }
  });
  return k;
}

}  // namespace tj::kernels
