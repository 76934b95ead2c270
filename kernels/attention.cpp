#include <cmath>

#include "kernels/library.h"

namespace tj::kernels {

const Kernel& attention() {
  static const Kernel k = kernel(
      "attention", {"q", "k", "v", "o", "scale", "causal"},
      [](In q, In k, In v, Out o, Scalar scale, bool causal) {
        auto [B, H, S, D] = q.shape<4>();
        auto S_kv = k.dim(2);
        for (auto bh : grid(B * H)) {
          auto b = floordiv(bh, H);
          auto h = bh % H;
          for (auto m : tile(S, block("m"))) {
            Var m_i = full({m}, -INFINITY, DType::f32);
            Var l_i = zeros({m}, DType::f32);
            Var acc = zeros({m, D}, DType::f32);
            auto qt = q.load(b, h, m, all);
            for (auto n : tile(causal ? minimum(m.end(), S_kv) : S_kv, block("n"))) {
              auto s = dot(qt, k.load(b, h, n, all).T()) * scale;
              if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
              auto m_new = maximum(m_i, amax(s, 1));
              auto p = exp2(s - m_new.col());
              auto alpha = exp2(m_i - m_new);
              l_i = l_i * alpha + sum(p, 1);
              acc = dot(p.to(v.dtype() == DType::f32 ? DType::f32 : v.dtype()), v.load(b, h, n, all), acc * alpha.col());
              m_i = m_new;
            }
            o.store(b, h, m, all, (acc / l_i.col()).to(o.dtype()));
          }
        }
      });
  return k;
}

}  // namespace tj::kernels
