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

const Kernel& rmsnorm() {
  static const Kernel k = kernel("rmsnorm", {"x", "w", "out", "eps"}, [](In x, In w, Out out, Scalar eps) {
    auto [rows, cols] = x.shape<2>();
    for (auto r : grid(rows)) {
      Var squares = constant(0.0, DType::f32);
      for (auto c : tile(cols, block("c"))) {             // pass 1: the sum of squares
        auto t = x.load(r, c).to(DType::f32);
        squares = squares + sum(t * t, 0);
      }
      auto inv_rms = rsqrt(squares / cols.to(DType::f32) + eps);
      for (auto c : tile(cols, block("c2")))              // pass 2: scale
        out.store(r, c, (x.load(r, c).to(DType::f32) * inv_rms * w.load(c).to(DType::f32)).to(out.dtype()));
    }
  });
  return k;
}

const Kernel& layernorm() {
  static const Kernel k = kernel("layernorm", {"x", "w", "b", "out", "eps"}, [](In x, In w, In b, Out out, Scalar eps) {
    auto [rows, cols] = x.shape<2>();
    for (auto r : grid(rows)) {
      // Sums of x - shift with shift = x[r, 0]: the variance E[d^2] - E[d]^2 of the shifted
      // values does not cancel away when the row's mean is large against its spread.
      auto shift = x.load(r, 0).to(DType::f32);
      Var s1 = constant(0.0, DType::f32);
      Var s2 = constant(0.0, DType::f32);
      for (auto c : tile(cols, block("c"))) {             // pass 1: the shifted sums
        auto d = x.load(r, c).to(DType::f32) - shift;
        s1 = s1 + sum(d, 0);
        s2 = s2 + sum(d * d, 0);
      }
      auto n = cols.to(DType::f32);
      auto mean_d = s1 / n;
      auto var = maximum(s2 / n - mean_d * mean_d, 0.0);
      auto rstd = rsqrt(var + eps);
      auto mean = mean_d + shift;
      for (auto c : tile(cols, block("c2"))) {            // pass 2: normalize, scale, shift
        auto y = (x.load(r, c).to(DType::f32) - mean) * rstd * w.load(c).to(DType::f32) + b.load(c).to(DType::f32);
        out.store(r, c, y.to(out.dtype()));
      }
    }
  });
  return k;
}

// Kept below the kernels above: golden files of generated code name their lines.
namespace {

// out = x (or out + x) rounded to out's dtype over [A, B, rows, cols].
void rows4_body(const TensorArg& out, const TensorArg& x, bool add) {
  auto [A, B, rows, cols] = out.shape<4>();
  for (auto ab : grid(A * B)) {
    auto a = floordiv(ab, B);
    auto b = ab % B;
    for (auto r : tile(rows, block("r")))
      for (auto c : tile(cols, block("c"))) {
        auto value = x.load(a, b, r, c);
        if (add) value = out.load(a, b, r, c).to(DType::f32) + value.to(DType::f32);
        out.store(a, b, r, c, value.to(out.dtype()));
      }
  }
}

}  // namespace

const Kernel& convert() {
  static const Kernel k = kernel("convert", {"x", "out"}, [](In x, Out out) { rows4_body(out, x, false); });
  return k;
}

const Kernel& merge_attention() {
  static const Kernel k = kernel("merge_attention", {"o", "lse", "o2", "lse2"}, [](InOut o, InOut lse, In o2, In lse2) {
    auto [B, H, S, D] = o.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H);
      auto h = bh % H;
      for (auto s : tile(S, block("s"))) {
        auto l1 = lse.load(b, h, s), l2 = lse2.load(b, h, s);
        auto top = maximum(l1, l2);
        auto top_safe = where(top == -INFINITY, 0.0, top);   // neither has keys: weights 0, lse -inf
        auto w1 = exp(l1 - top_safe), w2 = exp(l2 - top_safe);
        auto den = w1 + w2;
        auto inv = where(den > 0.0, 1.0 / den, 0.0);
        // A side without keys (weight 0) may hold anything, NaN too: it is not read into the sum.
        auto o1 = where((w1 > 0.0).col(), o.load(b, h, s, all).to(DType::f32), 0.0);
        auto o2v = where((w2 > 0.0).col(), o2.load(b, h, s, all).to(DType::f32), 0.0);
        o.store(b, h, s, all, (o1 * (w1 * inv).col() + o2v * (w2 * inv).col()).to(o.dtype()));
        lse.store(b, h, s, top_safe + log(den));
      }
    }
  });
  return k;
}

const Kernel& accumulate() {
  static const Kernel k = kernel("accumulate", {"out", "x"}, [](InOut out, In x) { rows4_body(out, x, true); });
  return k;
}

const Kernel& fill_zeros() {
  static const Kernel k = kernel("fill_zeros", {"out"}, [](Out out) {
    for (auto i : tile(out.dim(0), block("n"))) out.store(i, zeros({i}, out.dtype()));
  });
  return k;
}

}  // namespace tj::kernels
