#include "kernels/attention_backward.h"

#include <fmt/format.h>

#include <cmath>

#include "autotune/launch.h"
#include "core/error.h"
#include "kernels/library.h"

namespace tj::kernels {

namespace {

// delta[b, h, i] = sum over d of do * o, and with lse / lse2 the LSE in log2 units (prepare).
void delta_body(In o, In dout, Out delta, In* lse, Out* lse2) {
  auto [B, H, S, D] = o.shape<4>();
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H), h = bh % H;
    for (auto m : tile(S, block("m"))) {
      auto prod = o.load(b, h, m, all).to(DType::f32) * dout.load(b, h, m, all).to(DType::f32);
      delta.store(b, h, m, sum(prod, 1));
      if (lse) lse2->store(b, h, m, lse->load(b, h, m) * 1.4426950408889634);
    }
  }
}

}  // namespace

const Kernel& attention_bwd_delta() {
  static const Kernel k = kernel("attention_bwd_delta", {"o", "do", "delta"},
                                 [](In o, In dout, Out delta) { delta_body(o, dout, delta, nullptr, nullptr); });
  return k;
}

const Kernel& attention_bwd_prepare() {
  static const Kernel k = kernel("attention_bwd_prepare", {"o", "do", "lse", "delta", "lse2"},
                                 [](In o, In dout, In lse, Out delta, Out lse2) { delta_body(o, dout, delta, &lse, &lse2); });
  return k;
}

namespace {

constexpr double kLn2 = 0.6931471805599453;

// dK and dV per key tile over every query tile (attention_bwd_dkdv), and with dq_acc this key
// tile's share of dQ added into it (attention_bwd_fused). scale: the forward's, log2(e) folded in;
// the scores' gradient is in natural units. Per key tile the scores are computed transposed (s^T =
// k q^T, [n, m]), so that every dot's rows are the key tile's and P^T and dS^T go into the next
// dots from registers.
void key_tile_body(In q, In k, In v, In dout, In lse, In delta, Out dk, Out dv, Out* dq_acc, Scalar scale, bool causal) {
  auto [B, H, S, D] = q.shape<4>();
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H), h = bh % H;
    for (auto n : tile(S, block("n"))) {
      Var dk_acc = zeros({n, D}, DType::f32);
      Var dv_acc = zeros({n, D}, DType::f32);
      auto kt = k.load(b, h, n, all);
      auto vt = v.load(b, h, n, all);
      // Causal: query tiles from this key tile on (the keys before a query see it).
      const Operand m_begin = causal ? Operand(n.begin()) : Operand(0);
      for (auto m : tile(m_begin, S, block("m"))) {
        auto qt = q.load(b, h, m, all);
        auto dot_ = dout.load(b, h, m, all);
        auto st = dot(kt, qt.T()) * scale;                                   // [n, m]
        if (causal) st = where(m.index().row() >= n.index().col(), st, -INFINITY);
        auto pt = exp2(st - lse.load(b, h, m).row());
        dv_acc = dot(pt.to(v.dtype()), dot_, dv_acc);                          // [n, D]
        auto dpt = dot(vt, dot_.T());                                          // [n, m]
        auto dst = (pt * (dpt - delta.load(b, h, m).row())).to(q.dtype());
        dk_acc = dot(dst, qt, dk_acc);                                         // [n, D]
        if (dq_acc) {
          auto dqt = dot(kt.T(), dst);                                         // [D, m]: this key tile's share of dq^T
          dq_acc->atomic_add(b, h, m, all, (dqt * (scale * kLn2)).T());
        }
      }
      dk.store(b, h, n, all, (dk_acc * (scale * kLn2)).to(dk.dtype()));
      dv.store(b, h, n, all, Tile(dv_acc).to(dv.dtype()));
    }
  }
}

}  // namespace

const Kernel& attention_bwd_dkdv() {
  static const Kernel k = kernel(
      "attention_bwd_dkdv", {"q", "k", "v", "do", "lse", "delta", "dk", "dv", "scale", "causal"},
      [](In q, In k, In v, In dout, In lse, In delta, Out dk, Out dv, Scalar scale, bool causal) {
        key_tile_body(q, k, v, dout, lse, delta, dk, dv, nullptr, scale, causal);
      });
  return k;
}

const Kernel& attention_bwd_dq() {
  static const Kernel k = kernel(
      "attention_bwd_dq", {"q", "k", "v", "do", "lse", "delta", "dq", "scale", "causal"},
      [](In q, In k, In v, In dout, In lse, In delta, Out dq, Scalar scale, bool causal) {
        auto [B, H, S, D] = q.shape<4>();
        for (auto bh : grid(B * H)) {
          auto b = floordiv(bh, H), h = bh % H;
          for (auto m : tile(S, block("m"))) {
            Var dq_acc = zeros({m, D}, DType::f32);
            auto qt = q.load(b, h, m, all);
            auto dot_ = dout.load(b, h, m, all);
            auto lse_m = lse.load(b, h, m).col();
            auto delta_m = delta.load(b, h, m).col();
            for (auto n : tile(causal ? m.end() : S, block("n"))) {
              auto kt = k.load(b, h, n, all);
              auto s = dot(qt, kt.T()) * scale;
              if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
              auto p = exp2(s - lse_m);
              auto dp = dot(dot_, v.load(b, h, n, all).T());
              auto ds = p * (dp - delta_m);
              dq_acc = dot(ds.to(q.dtype()), kt, dq_acc);
            }
            dq.store(b, h, m, all, (dq_acc * (scale * kLn2)).to(dq.dtype()));
          }
        }
      });
  return k;
}

const Kernel& attention_bwd_fused() {
  static const Kernel k = kernel(
      "attention_bwd_fused", {"q", "k", "v", "do", "lse", "delta", "dk", "dv", "dq_acc", "scale", "causal"},
      [](In q, In k, In v, In dout, In lse, In delta, Out dk, Out dv, Out dq_acc, Scalar scale, bool causal) {
        key_tile_body(q, k, v, dout, lse, delta, dk, dv, &dq_acc, scale, causal);
      });
  return k;
}

const Kernel& attention_bwd_dq_convert() {
  static const Kernel k = kernel("attention_bwd_dq_convert", {"dq_acc", "dq"}, [](In dq_acc, Out dq) {
    auto [B, H, S, D] = dq_acc.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H), h = bh % H;
      for (auto m : tile(S, block("m"))) dq.store(b, h, m, all, dq_acc.load(b, h, m, all).to(dq.dtype()));
    }
  });
  return k;
}

namespace {

void check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& dout,
                  const TensorView& lse, const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  auto fail = [](const std::string& why) { throw Error("attention backward: " + why); };
  if (q.rank() != 4) fail(fmt::format("q is {}: expected [B, H, S, D]", q.describe()));
  if (k.shape[1] != q.shape[1] && k.rank() == 4)
    fail(fmt::format("k has {} heads and q {}: grouped-query heads are not supported by the backward yet", k.shape[1], q.shape[1]));
  const std::pair<const char*, const TensorView*> same[] = {{"k", &k}, {"v", &v}, {"o", &o}, {"do", &dout},
                                                            {"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& [what, t] : same)
    if (t->shape != q.shape) fail(fmt::format("{} is {}: expected the shape of q, {}", what, t->describe(), q.describe()));
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) fail(fmt::format("q is {}: expected bf16 or f16", q.describe()));
  for (const auto& [what, t] : {std::pair<const char*, const TensorView*>{"k", &k}, {"v", &v}, {"o", &o}, {"do", &dout}})
    if (t->dtype != q.dtype) fail(fmt::format("{} is {}: expected q's dtype, {}", what, t->describe(), tj::name(q.dtype)));
  for (const auto& [what, t] : {std::pair<const char*, const TensorView*>{"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
    if (!is_float(t->dtype) || is_fp8(t->dtype)) fail(fmt::format("{} is {}: expected f32, bf16 or f16", what, t->describe()));
  if (lse.dtype != DType::f32 || lse.shape != std::vector<int64_t>{q.shape[0], q.shape[1], q.shape[2]})
    fail(fmt::format("lse is {}: expected f32[{}, {}, {}] (the forward's)", lse.describe(), q.shape[0], q.shape[1], q.shape[2]));
}

}  // namespace

std::vector<BackwardLaunch> attention_backward_launches(const TensorView& q, const TensorView& k, const TensorView& v,
                                                        const TensorView& o, const TensorView& dout, const TensorView& lse,
                                                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                                        const AttentionBackwardOptions& opt, const TensorView& delta,
                                                        const TensorView& lse2, const std::optional<TensorView>& dq_acc) {
  check_inputs(q, k, v, o, dout, lse, dq, dk, dv);
  if (!opt.deterministic && !dq_acc) throw Error("attention backward: the fused pass needs its dq_acc scratch");
  const double scale = 1.4426950408889634 * opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(q.shape[3])));
  std::vector<BackwardLaunch> out;
  out.push_back({&attention_bwd_prepare(), {o, dout, lse, delta, lse2}});
  if (opt.deterministic) {
    out.push_back({&attention_bwd_dkdv(), {q, k, v, dout, lse2, delta, dk, dv, scale, opt.causal}});
    out.push_back({&attention_bwd_dq(), {q, k, v, dout, lse2, delta, dq, scale, opt.causal}});
  } else {
    out.push_back({&attention_bwd_fused(), {q, k, v, dout, lse2, delta, dk, dv, *dq_acc, scale, opt.causal}});
    out.push_back({&attention_bwd_dq_convert(), {*dq_acc, dq}});
  }
  return out;
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionBackwardOptions& opt, AttentionBackwardWorkspace& ws) {
  check_inputs(q, k, v, o, dout, lse, dq, dk, dv);
  const std::vector<int64_t> rows = {q.shape[0], q.shape[1], q.shape[2]};
  for (auto* t : {&ws.delta, &ws.lse2})
    if (!*t || (*t)->shape() != rows) t->emplace(DType::f32, rows);
  std::optional<TensorView> acc;
  if (!opt.deterministic) {
    if (!ws.dq_acc || ws.dq_acc->shape() != q.shape) ws.dq_acc.emplace(DType::f32, q.shape);
    ws.dq_acc->fill_bytes_async(0, opt.stream);
    acc = ws.dq_acc->view();
  }
  LaunchOptions lo;
  lo.stream = opt.stream;
  for (const BackwardLaunch& l : attention_backward_launches(q, k, v, o, dout, lse, dq, dk, dv, opt, ws.delta->view(),
                                                             ws.lse2->view(), acc))
    launch(*l.kernel, l.args, lo);
}

std::vector<BackwardLaunch> ring_backward_step_launches(const RingPlan& plan, int64_t rank, int64_t step, const RingBackwardViews& v) {
  if (plan.window > 0) throw Error("ring attention backward: a sliding window is not supported yet (" + plan.describe() + ")");
  const int64_t L = plan.chunk_rows();
  auto rows = [L](const TensorView& t, int chunk) { return slice_of(t, 2, chunk * L, L); };
  std::vector<BackwardLaunch> out;
  for (const RingPlan::Launch& l : plan.launches(rank, step)) {
    const bool causal = l.mode == RingPlan::Mode::causal;
    out.push_back({&attention_bwd_fused(),
                   {rows(v.q, l.q_chunk), rows(v.k, l.kv_chunk), rows(v.v, l.kv_chunk), rows(v.dout, l.q_chunk),
                    rows(v.lse2, l.q_chunk), rows(v.delta, l.q_chunk), v.dk_part, v.dv_part, rows(v.dq_acc, l.q_chunk), v.scale,
                    causal}});
    out.push_back({&accumulate(), {rows(v.dk_acc, l.kv_chunk), v.dk_part}});
    out.push_back({&accumulate(), {rows(v.dv_acc, l.kv_chunk), v.dv_part}});
  }
  return out;
}

}  // namespace tj::kernels
