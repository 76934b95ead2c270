// FP8 quantization pre-pass for attention (and any [B, H, S, D] tensor), in the DSL.
//
//   descale[b, h] = amax(|x[b, h, :, :]|) / fp8_max     (1 where the slice is all zero)
//   y[b, h, s, d] = fp8(x[b, h, s, d] * (1 / descale[b, h]))      (saturating, round to nearest)
//
// One program per (b, h): a first tile loop finds the amax, a second one quantizes (fused: the
// descale never leaves the program). quantize_transpose_fp8 writes yᵀ [B, H, D, S_pad] instead
// -- the layout FP8 wgmma needs for P·V (both operands K-major) -- so attention can take V in
// its natural layout. fp8_max is 448 for e4m3 outputs and 57344 for e5m2.
#include "kernels/library.h"

namespace tj::kernels {

namespace {

double fp8_max(DType t) { return t == DType::e5m2 ? 57344.0 : 448.0; }

// amax of |x[b, h, :, :]| over S in tiles of block `name` (an f32 scalar).
Tile slice_amax(const In& x, const Tile& b, const Tile& h, const Tile& S, const char* name) {
  Var mx = constant(0.0, DType::f32);
  for (auto s : tile(S, block(name))) {
    auto t = abs(x.load(b, h, s, all).to(DType::f32));
    mx = maximum(mx, amax(amax(t, 1), 0));
  }
  return mx;
}

}  // namespace

const Kernel& quantize_fp8() {
  static const Kernel k = kernel(
      "quantize_fp8", {"x", "y", "descale"}, [](In x, Out y, Out descale) {
        auto [B, H, S, D] = x.shape<4>();
        for (auto bh : grid(B * H)) {
          auto b = floordiv(bh, H);
          auto h = bh % H;
          auto mx = slice_amax(x, b, h, S, "s");
          auto ds = where(mx > 0.0, mx * (1.0 / fp8_max(y.dtype())), 1.0);
          descale.store(b, h, ds);
          auto inv = 1.0 / ds;
          for (auto s : tile(S, block("s2"))) {
            y.store(b, h, s, all, (x.load(b, h, s, all).to(DType::f32) * inv).to(y.dtype()));
          }
        }
      });
  return k;
}

const Kernel& quantize_transpose_fp8() {
  static const Kernel k = kernel(
      "quantize_transpose_fp8", {"x", "yt", "descale"}, [](In x, Out yt, Out descale) {
        auto [B, H, S, D] = x.shape<4>();
        for (auto bh : grid(B * H)) {
          auto b = floordiv(bh, H);
          auto h = bh % H;
          auto mx = slice_amax(x, b, h, S, "s");
          auto ds = where(mx > 0.0, mx * (1.0 / fp8_max(yt.dtype())), 1.0);
          descale.store(b, h, ds);
          auto inv = 1.0 / ds;
          // Tiles past S load zeros, so the pad columns [S, S_pad) of the last tile get zeros.
          for (auto s : tile(S, block("s2"))) {
            auto q = (x.load(b, h, s, all).to(DType::f32) * inv).to(yt.dtype());
            yt.store(b, h, all, s, q.T());
          }
        }
      });
  return k;
}

}  // namespace tj::kernels
