#include "examples/kernels/user_kernels.h"

#include <cmath>

namespace tj::examples {

namespace {

// gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))
Tile gelu(const Tile& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return x * 0.5 * (tanh((x + x * x * x * 0.044715) * c) + 1.0);
}

}  // namespace

const Kernel& gemm_bias_gelu(bool b_kn) {
  static const Kernel kn = kernel("gemm_bias_gelu_kn", {"a", "b", "bias", "c"}, [](In a, In b, In bias, Out c) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(1);
    for (auto m : tile(M, block("m"))) {
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(k, n), acc);
        c.store(m, n, gelu(acc + bias.load(n).to(DType::f32).row()).to(c.dtype()));
      }
    }
  });
  static const Kernel nk = kernel("gemm_bias_gelu_nk", {"a", "b", "bias", "c"}, [](In a, In b, In bias, Out c) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m"))) {
      for (auto n : tile(N, block("n"))) {
        Var acc = zeros({m, n}, DType::f32);
        for (auto k : tile(K, block("k"))) acc = dot(a.load(m, k), b.load(n, k).T(), acc);
        c.store(m, n, gelu(acc + bias.load(n).to(DType::f32).row()).to(c.dtype()));
      }
    }
  });
  return b_kn ? kn : nk;
}

const Kernel& batched_gemm() {
  static const Kernel k = kernel("batched_gemm", {"a", "b", "c"}, [](In a, In b, Out c) {
    auto [Z, M, K] = a.shape<3>();
    auto N = b.dim(1);
    for (auto z : grid(Z)) {
      for (auto m : tile(M, block("m"))) {
        for (auto n : tile(N, block("n"))) {
          Var acc = zeros({m, n}, DType::f32);
          for (auto kk : tile(K, block("k"))) acc = dot(a.load(z, m, kk), b.load(z, n, kk).T(), acc);
          c.store(z, m, n, acc.to(c.dtype()));
        }
      }
    }
  });
  return k;
}

const Kernel& swiglu() {
  static const Kernel k = kernel("swiglu", {"x", "wg", "wu", "y"}, [](In x, In wg, In wu, Out y) {
    auto [M, K] = x.shape<2>();
    auto N = wg.dim(0);
    for (auto m : tile(M, block("m"))) {
      for (auto n : tile(N, block("n"))) {
        Var gate = zeros({m, n}, DType::f32);
        Var up = zeros({m, n}, DType::f32);
        for (auto kk : tile(K, block("k"))) {
          auto xt = x.load(m, kk);
          gate = dot(xt, wg.load(n, kk).T(), gate);
          up = dot(xt, wu.load(n, kk).T(), up);
        }
        Tile g = gate;
        y.store(m, n, (g / (exp(-g) + 1.0) * up).to(y.dtype()));
      }
    }
  });
  return k;
}

const Kernel& readme_attention() {
  static const Kernel k = kernel("readme_attention", {"q", "k", "v", "o", "scale", "causal"},
                                 [](In q, In k, In v, Out o, Scalar scale, bool causal) {
    auto [B, H, S, D] = q.shape<4>();
    for (auto bh : grid(B * H)) {                       // outer loops: the launch grid
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) {              // block size: a tunable
        Var m_i = full({m}, -INFINITY, DType::f32);     // state a loop updates: tj::Var
        Var l_i = zeros({m}, DType::f32);
        Var acc = zeros({m, D}, DType::f32);
        auto qt = q.load(b, h, m, all);                 // masked at the edges automatically
        for (auto n : tile(causal ? m.end() : S, block("n"))) {
          auto s = dot(qt, k.load(b, h, n, all).T()) * scale;
          if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
          auto m_new = maximum(m_i, amax(s, 1));
          m_new = where(m_new > m_i + 8, m_new, m_i);   // lazy: moves by more than 8 only
          auto p = exp2(s - m_new.col());
          auto alpha = exp2(m_i - m_new);
          l_i = l_i * alpha + sum(p, 1);
          acc = dot(p.to(v.dtype()), v.load(b, h, n, all), acc * alpha.col());
          m_i = m_new;
        }
        o.store(b, h, m, all, (acc / l_i.col()).to(o.dtype()));
      }
    }
  });
  return k;
}

const Kernel& readme_attention_vt() {
  static const Kernel k = kernel("readme_attention_vt", {"q", "k", "vt", "o", "scale", "causal"},
                                 [](In q, In k, In vt, Out o, Scalar scale, bool causal) {
    auto [B, H, S, D] = q.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) {
        Var m_i = full({m}, -INFINITY, DType::f32);
        Var l_i = zeros({m}, DType::f32);
        Var acc = zeros({m, D}, DType::f32);
        auto qt = q.load(b, h, m, all);
        for (auto n : tile(causal ? m.end() : S, block("n"))) {
          auto s = dot(qt, k.load(b, h, n, all).T()) * scale;
          if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
          auto m_new = maximum(m_i, amax(s, 1));
          m_new = where(m_new > m_i + 8, m_new, m_i);   // lazy: moves by more than 8 only
          auto p = exp2(s - m_new.col());
          auto alpha = exp2(m_i - m_new);
          l_i = l_i * alpha + sum(p, 1);
          acc = dot(p.to(vt.dtype()), vt.load(b, h, all, n).T(), acc * alpha.col());
          m_i = m_new;
        }
        o.store(b, h, m, all, (acc / l_i.col()).to(o.dtype()));
      }
    }
  });
  return k;
}

const Kernel& sink_attention() {
  static const Kernel k = kernel("sink_attention", {"q", "k", "v", "sinks", "o", "scale"},
                                 [](In q, In k, In v, In sinks, Out o, Scalar scale) {
    auto [B, H, S, D] = q.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) {
        // The sink is a key every query sees, with logit sinks[h] and a zero value: the running
        // max starts at it and the sum at its exp2, 1.
        Var m_i = zeros({m}, DType::f32) + sinks.load(h).to(DType::f32);
        Var l_i = full({m}, 1.0, DType::f32);
        Var acc = zeros({m, D}, DType::f32);
        auto qt = q.load(b, h, m, all);
        for (auto n : tile(S, block("n"))) {
          auto s = dot(qt, k.load(b, h, n, all).T()) * scale;
          auto m_new = maximum(m_i, amax(s, 1));
          m_new = where(m_new > m_i + 8, m_new, m_i);   // lazy: moves by more than 8 only
          auto p = exp2(s - m_new.col());
          auto alpha = exp2(m_i - m_new);
          l_i = l_i * alpha + sum(p, 1);
          acc = dot(p.to(v.dtype()), v.load(b, h, n, all), acc * alpha.col());
          m_i = m_new;
        }
        o.store(b, h, m, all, (acc / l_i.col()).to(o.dtype()));
      }
    }
  });
  return k;
}

const Kernel& mla_attention() {
  static const Kernel k = kernel("mla_attention", {"q", "k", "v", "o", "scale"}, [](In q, In k, In v, Out o, Scalar scale) {
    auto [B, H, S, Dqk] = q.shape<4>();
    auto Dv = v.dim(3);
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) {
        Var m_i = full({m}, -INFINITY, DType::f32);
        Var l_i = zeros({m}, DType::f32);
        Var acc = zeros({m, Dv}, DType::f32);
        auto qt = q.load(b, h, m, all);
        for (auto n : tile(S, block("n"))) {
          auto s = dot(qt, k.load(b, h, n, all).T()) * scale;
          auto m_new = maximum(m_i, amax(s, 1));
          m_new = where(m_new > m_i + 8, m_new, m_i);   // lazy: moves by more than 8 only
          auto p = exp2(s - m_new.col());
          auto alpha = exp2(m_i - m_new);
          l_i = l_i * alpha + sum(p, 1);
          acc = dot(p.to(v.dtype()), v.load(b, h, n, all), acc * alpha.col());
          m_i = m_new;
        }
        o.store(b, h, m, all, (acc / l_i.col()).to(o.dtype()));
      }
    }
  });
  return k;
}

const Kernel& splitk_gemm() {
  static const Kernel k = kernel("splitk_gemm", {"a", "b", "c"}, [](In a, In b, Out c) {
    auto [M, K] = a.shape<2>();
    auto N = b.dim(0);
    for (auto m : tile(M, block("m"))) {
      for (auto n : tile(N, block("n"))) {
        for (auto ks : tile(K, block("ks"))) {   // the K split: one more launch loop
          Var acc = zeros({m, n}, DType::f32);
          for (auto kk : tile(ks.begin(), ks.end(), block("k"))) acc = dot(a.load(m, kk), b.load(n, kk).T(), acc);
          c.atomic_add(m, n, Tile(acc));
        }
      }
    }
  });
  return k;
}

const Kernel& grouped_gemm() {
  static const Kernel k = kernel("grouped_gemm", {"x", "w", "offs", "y"}, [](In x, In w, In offs, Out y) {
    auto K = x.dim(1);
    auto [G, N, Kw] = w.shape<3>();
    for (auto g : grid(G)) {
      for (auto n : tile(N, block("n"))) {
        auto begin = offs.load(g);
        auto end = offs.load(g + 1);
        for (auto m : tile(begin, end, block("m"))) {
          Var acc = zeros({m, n}, DType::f32);
          for (auto kk : tile(K, block("k"))) acc = dot(x.load(m, kk), w.load(g, n, kk).T(), acc);
          y.store_where(m.index().col() < end, m, n, acc.to(y.dtype()));
        }
      }
    }
  });
  return k;
}

const Kernel& attention_varlen() {
  static const Kernel k = kernel("attention_varlen", {"q", "k", "v", "cu_q", "cu_k", "o", "scale", "causal"},
                                 [](In q, In k, In v, In cu_q, In cu_k, Out o, Scalar scale, bool causal) {
    auto H = q.dim(1), D = q.dim(2);
    auto Hkv = k.dim(1);
    auto B = cu_q.dim(0) - 1;
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H, hk = floordiv(h, floordiv(H, Hkv));
      auto q0 = cu_q.load(b), q1 = cu_q.load(b + 1);
      auto k0 = cu_k.load(b), k1 = cu_k.load(b + 1);
      for (auto m : tile(q0, q1, block("m"))) {              // this sequence's query tiles
        Var m_i = full({m}, -INFINITY, DType::f32);
        Var l_i = zeros({m}, DType::f32);
        Var acc = zeros({m, D}, DType::f32);
        auto qt = q.load(m, h, all);
        auto rows = m.index().col() - q0;                    // positions in the sequence
        for (auto n : tile(k0, causal ? minimum(k0 + (m.end() - q0), k1) : k1, block("n"))) {
          auto s = dot(qt, k.load(n, hk, all).T()) * scale;
          auto keys = n.index().row() - k0;
          auto keep = n.index().row() < k1;                  // the last key tile reaches into the next sequence
          s = where(causal ? keep && keys <= rows : keep, s, -INFINITY);
          auto m_new = maximum(m_i, amax(s, 1));
          m_new = where(m_new > m_i + 8, m_new, m_i);          // lazy: moves by more than 8 only
          auto m_use = where(m_new == -INFINITY, 0.0, m_new);   // rows that see no key yet
          auto p = exp2(s - m_use.col());
          auto alpha = exp2(m_i - m_use);
          l_i = l_i * alpha + sum(p, 1);
          acc = dot(p.to(v.dtype()), v.load(n, hk, all), acc * alpha.col());
          m_i = m_new;
        }
        o.store_where(m.index().col() < q1, m, h, all, (acc / l_i.col()).to(o.dtype()));
      }
    }
  });
  return k;
}

const Kernel& window_attention() {
  static const Kernel k = kernel("window_attention", {"q", "k", "v", "o", "scale", "window"},
                                 [](In q, In k, In v, Out o, Scalar scale, int64_t window) {
    auto [B, H, S, D] = q.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) {
        Var m_i = full({m}, -INFINITY, DType::f32);
        Var l_i = zeros({m}, DType::f32);
        Var acc = zeros({m, D}, DType::f32);
        auto qt = q.load(b, h, m, all);
        for (auto n : tile(m.end(), block("n"))) {
          auto s = dot(qt, k.load(b, h, n, all).T()) * scale;
          auto q_at = m.index().col(), kv_at = n.index().row();
          s = where(kv_at <= q_at && q_at - kv_at < window, s, -INFINITY);
          auto m_new = maximum(m_i, amax(s, 1));
          auto p = exp2(s - where(m_new == -INFINITY, 0.0, m_new).col());   // a row that saw no key yet
          auto alpha = where(m_new == -INFINITY, 1.0, exp2(m_i - m_new));
          l_i = l_i * alpha + sum(p, 1);
          acc = dot(p.to(v.dtype()), v.load(b, h, n, all), acc * alpha.col());
          m_i = m_new;
        }
        o.store(b, h, m, all, (acc / l_i.col()).to(o.dtype()));
      }
    }
  });
  return k;
}

}  // namespace tj::examples
