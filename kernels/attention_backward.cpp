#include "kernels/attention_backward.h"

#include <fmt/format.h>

#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "autotune/launch.h"
#include "codegen/emitter_knobs.h"
#include "codegen/lowering.h"
#include "codegen/mma_config.h"
#include "codegen/target.h"
#include "core/error.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variants.h"
#include "kernels/library.h"

namespace tj::kernels {

namespace {

// delta[b, h, i] = sum over d of do * o (with sdo: do's descale [B, H], of an e4m3 do), and with
// lse / lse2 the LSE in log2 units (prepare).
void delta_body(In o, In dout, Out delta, In* lse, Out* lse2, In* sdo = nullptr) {
  auto [B, H, S, D] = o.shape<4>();
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H), h = bh % H;
    std::optional<Tile> descale;
    if (sdo) descale = sdo->load(b, h);
    for (auto m : tile(S, block("m"))) {
      auto prod = o.load(b, h, m, all).to(DType::f32) * dout.load(b, h, m, all).to(DType::f32);
      delta.store(b, h, m, descale ? sum(prod, 1) * *descale : sum(prod, 1));
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

const Kernel& attention_bwd_prepare_fp8() {
  static const Kernel k =
      kernel("attention_bwd_prepare_fp8", {"o", "do", "sdo", "lse", "delta", "lse2"},
             [](In o, In dout, In sdo, In lse, Out delta, Out lse2) { delta_body(o, dout, delta, &lse, &lse2, &sdo); });
  return k;
}

namespace {

constexpr double kLn2 = 0.6931471805599453;

// Where query head h of q [B, H, Sq, D] finds its keys in k [B, Hkv, Skv, D]: kv head h / (H /
// Hkv), and Skv. Where the heads (the lengths) match, h (q's Sq) itself, so that multi-head kernels
// trace as they would without grouped-query support.
struct KeySide {
  bool same_length;
  Int length;
  Int head;
};
KeySide key_side(const In& q, const In& k, const Int& H, const Int& Sq, const Int& h) {
  const bool same_heads = q.static_dim(1) && q.static_dim(1) == k.static_dim(1);
  const bool same_length = q.static_dim(2) && q.static_dim(2) == k.static_dim(2);
  return {same_length, same_length ? Sq : k.dim(2), same_heads ? h : h / (H / k.dim(1))};
}

// The FP8 backward's recipe (bench/attention/backward_emulation.py: "e4m3 Q K V P dO, e5m2 dS x
// 2^12"): q, k, v and do e4m3 with descales per (batch, head), [B, H] for q and do, [B, Hkv] for k
// and v; P goes into dV's product as e4m3 of 2^8 P (P <= 1 would fall to e4m3's subnormals), dS
// into dK's and dQ's as e5m2 of 2^12 dS (about 1e-4 on N(0, 1) inputs at 4k keys: below e5m2's
// normal range unscaled); the scales and descales leave in the epilogues.
// FP8 wgmma reads both operands K-major (the reduced dim contiguous): where a product reduces over
// the rows of q, do (dK, dV: over the query rows) or k (dQ: over the keys), it reads the transposed
// e4m3 copy [B, H, D, S_pad] (quantize_transpose_fp8's layout) instead, so the operand goes from
// global memory to shared memory by TMA as it is, with no transposition through registers.
struct Fp8Inputs {
  const In *sq, *sk, *sv, *sdo;           // descales
  const In *qt = nullptr, *dout_t = nullptr, *kt = nullptr;   // transposed copies (see above)
};
constexpr double kPScale = 256.0, kDsScale = 4096.0;
// How the kernels make them: dK / dV's 2^8 P = exp2(s - (lse - 8)), and 2^12 dS = 2^8 P . 2^4 (dP -
// delta); dQ's 2^4 P = exp2(s - (lse - 4)) and 2^12 dS = 2^4 P . 2^8 (dP - delta).
constexpr double kPLog2 = 8.0, kDpScale = kDsScale / kPScale, kQPLog2 = 4.0, kQDpScale = 256.0;

// A program's descales (scalars): q's and do's of query head h, k's and v's of kv head hk; the
// scores' (sq sk) and dP's (sv sdo) factors.
struct Fp8ProgramScales {
  Tile sq, sk, sv, sdo, scores, dp;
};
Fp8ProgramScales load_descales(const Fp8Inputs& f8, const Int& b, const Int& h, const Int& hk) {
  const Tile sq = f8.sq->load(b, h), sk = f8.sk->load(b, hk), sv = f8.sv->load(b, hk), sdo = f8.sdo->load(b, h);
  return {sq, sk, sv, sdo, sq * sk, sv * sdo};
}

// A variant traced into the backward kernels: its hooks (apply_variant_hooks, with score_grad) on
// the recomputed scores, [m, n] in dQ's kernel and transposed [n, m] in dK / dV's (the positions
// broadcast either way), and its extra inputs.
struct VariantHooks {
  const AttentionVariant* variant = nullptr;
  std::vector<In> inputs;
  std::vector<Out> param_grads;   // the dK / dV kernel's: one f32 [H] per learnable input
};

// d modded / d input[h] of v's learnable inputs (param_grad's tiles, checked, f32).
std::vector<Tile> param_grads(const AttentionVariant& v, const ScoreModValues& modded, const ScoreIndex& at) {
  std::vector<Tile> d = v.param_grad(modded.score, modded.modded, at);
  if (d.size() != v.learnable.size())
    throw Error(fmt::format("attention variant '{}': param_grad returned {} tile(s) for {} learnable input(s)", v.name, d.size(),
                            v.learnable.size()));
  for (Tile& t : d) {
    if (!t.valid() || !is_float(t.dtype()))
      throw Error(fmt::format("attention variant '{}': param_grad must return float tiles (d modded / d input[h])", v.name));
    t = t.to(DType::f32);
  }
  return d;
}

// The forward's LSE of a row that sees no key is -inf; as +inf its P is exp2(s - inf) = 0 (not
// exp2(-inf + inf) = NaN), so such rows add nothing, as in the forward (O = 0).
Tile masked_rows_lse(const Tile& lse, const VariantHooks* hooks) {
  if (!hooks || !hooks->variant->mask_mod) return lse;
  return where(lse == -INFINITY, INFINITY, lse);
}

// dK and dV per key tile over every query tile (attention_bwd_dkdv), and with dq_acc this key
// tile's share of dQ added into it (attention_bwd_fused). scale: the forward's, log2(e) folded in;
// the scores' gradient is in natural units. Per key tile the scores are computed transposed (s^T =
// k q^T, [n, m]), so that every dot's rows are the key tile's and P^T and dS^T go into the next
// dots from registers.
// Grouped-query heads: q [B, H, Sq, D], k / v [B, Hkv, Skv, D]; query head h reads kv head h / (H /
// Hkv), and dk / dv [B, H, Skv, D] are per query head (the host sums each group's).
void key_tile_body(In q, In k, In v, In dout, In lse, In delta, Out dk, Out dv, Out* dq_acc, Scalar scale, bool causal,
                   const Fp8Inputs* f8 = nullptr, const VariantHooks* hooks = nullptr) {
  auto [B, H, Sq, D] = q.shape<4>();
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H), h = bh % H;
    const KeySide keys = key_side(q, k, H, Sq, h);
    const Int& hk = keys.head;
    // FP8: the scores' and dP's descales, and the epilogues' (scalars of the program).
    std::optional<Tile> s_scale, dp_scale, dk_scale, dv_scale;
    if (f8) {
      const Fp8ProgramScales ps = load_descales(*f8, b, h, hk);
      s_scale = ps.scores;
      dp_scale = ps.dp;
      dk_scale = ps.sq * (1.0 / kDsScale);
      dv_scale = ps.sdo * (1.0 / kPScale);
    }
    for (auto n : tile(keys.length, block("n"))) {
      Var dk_acc = zeros({n, D}, DType::f32);
      Var dv_acc = zeros({n, D}, DType::f32);
      // Learnable inputs: their gradient's share per key row, summed over the query tiles.
      std::deque<Var> param_acc;
      if (hooks)
        for (size_t i = 0; i < hooks->param_grads.size(); ++i) param_acc.emplace_back(zeros({n}, DType::f32));
      auto kt = k.load(b, hk, n, all);
      auto vt = v.load(b, hk, n, all);
      // Causal (top-left): query tiles from this key tile on (the keys before a query see it).
      const Operand m_begin = causal ? Operand(n.begin()) : Operand(0);
      for (auto m : tile(m_begin, Sq, block("m"))) {
        auto qt = q.load(b, h, m, all);
        auto dot_ = dout.load(b, h, m, all);
        auto st = f8 ? dot(kt, qt.T()) * (scale * *s_scale) : dot(kt, qt.T()) * scale;   // [n, m]
        std::optional<Tile> grad;   // a variant's d score_mod / d score
        ScoreModValues modded;      // and what its score_mod saw and made
        auto at = [&] { return ScoreIndex{b, h, m.index().row(), n.index().col(), hooks->inputs}; };
        if (hooks) st = apply_variant_hooks(*hooks->variant, st, at, &grad, &modded);
        // Learnable inputs: d modded / d input[h], traced where the gradient of the modded score
        // is (not beside score_mod: no tile of it lives across the dots), times it, summed per row.
        auto add_param_grads = [&](const Tile& ds) {
          if (param_acc.empty()) return;
          const std::vector<Tile> d = param_grads(*hooks->variant, modded, at());
          for (size_t i = 0; i < d.size(); ++i) param_acc[i] = param_acc[i] + sum(ds * d[i], 1);
        };
        if (causal) st = where(m.index().row() >= n.index().col(), st, -INFINITY);
        std::optional<Tile> dst;
        if (f8) {
          // 2^8 P from the exponent and 2^12 dS = 2^8 P . 2^4 (dP - delta): the scales folded into
          // the row terms, so a score costs one multiply-add, the exp2, one multiply-add and a
          // multiply besides the conversions.
          auto pt = exp2(st - (masked_rows_lse(lse.load(b, h, m), hooks) - kPLog2).row());   // 2^8 P
          dv_acc = dot(pt.to(DType::e4m3), f8->dout_t->load(b, h, all, m).T(), dv_acc);
          auto dpt = dot(vt, dot_.T()) * (*dp_scale * kDpScale) - (delta.load(b, h, m) * kDpScale).row();
          auto ds = pt * dpt;   // 2^12 d loss / d modded score
          add_param_grads(ds);
          if (grad) ds = ds * *grad;
          dst = ds.to(DType::e5m2);
          dk_acc = dot(*dst, f8->qt->load(b, h, all, m).T(), dk_acc);   // [n, D]
        } else {
          auto pt = exp2(st - masked_rows_lse(lse.load(b, h, m), hooks).row());
          dv_acc = dot(pt.to(v.dtype()), dot_, dv_acc);   // [n, D]
          auto dpt = dot(vt, dot_.T());                    // [n, m]
          auto ds = pt * (dpt - delta.load(b, h, m).row());   // d loss / d modded score
          add_param_grads(ds);
          if (grad) ds = ds * *grad;
          dst = ds.to(q.dtype());
          dk_acc = dot(*dst, qt, dk_acc);   // [n, D]
        }
        if (dq_acc) {
          auto dqt = dot(kt.T(), *dst);                                        // [D, m]: this key tile's share of dq^T
          dq_acc->atomic_add(b, h, m, all, (dqt * (scale * kLn2)).T());
        }
      }
      for (size_t i = 0; i < param_acc.size(); ++i)   // (fp8: the sums are of 2^12 dS)
        hooks->param_grads[i].atomic_add(h, f8 ? sum(Tile(param_acc[i]), 0) * (1.0 / kDsScale) : sum(Tile(param_acc[i]), 0));
      if (f8) {
        dk.store(b, h, n, all, (dk_acc * (scale * kLn2) * *dk_scale).to(dk.dtype()));
        dv.store(b, h, n, all, (dv_acc * *dv_scale).to(dv.dtype()));
      } else {
        dk.store(b, h, n, all, (dk_acc * (scale * kLn2)).to(dk.dtype()));
        dv.store(b, h, n, all, Tile(dv_acc).to(dv.dtype()));
      }
    }
  }
}

}  // namespace

namespace {
// The backward kernels' parameters, shared by the library's kernels and each variant's (the
// variant's inputs follow them). Outputs: dK / dV 6-7, dQ 6; FP8: dK / dV 12-13, dQ 11.
const std::vector<std::string> kDkdvParams = {"q", "k", "v", "do", "lse", "delta", "dk", "dv", "scale", "causal"};
const std::vector<std::string> kDqParams = {"q", "k", "v", "do", "lse", "delta", "dq", "scale", "causal"};
// The FP8 kernels' (attention_bwd_dkdv_fp8 / attention_bwd_dq_fp8): outputs 12-13 / 11.
const std::vector<std::string> kDkdvFp8Params = {"q", "qt", "k", "v", "do", "dot", "lse", "delta", "sq", "sk", "sv", "sdo",
                                                 "dk", "dv", "scale", "causal"};
const std::vector<std::string> kDqFp8Params = {"q", "k", "kt", "v", "do", "lse", "delta", "sq", "sk", "sv", "sdo", "dq", "scale",
                                               "causal"};
}  // namespace

const Kernel& attention_bwd_dkdv() {
  static const Kernel k = kernel(
      "attention_bwd_dkdv", kDkdvParams,
      [](In q, In k, In v, In dout, In lse, In delta, Out dk, Out dv, Scalar scale, bool causal) {
        key_tile_body(q, k, v, dout, lse, delta, dk, dv, nullptr, scale, causal);
      });
  return k;
}

namespace {
// dQ per query tile over every key tile (attention_bwd_dq; f8: attention_bwd_dq_fp8's recipe).
void query_tile_body(In q, In k, In v, In dout, In lse, In delta, Out dq, Scalar scale, bool causal,
                     const Fp8Inputs* f8 = nullptr, const VariantHooks* hooks = nullptr) {
  auto [B, H, Sq, D] = q.shape<4>();
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H), h = bh % H;
    const KeySide keys = key_side(q, k, H, Sq, h);
    const Int& hk = keys.head;
    std::optional<Tile> s_scale, dp_scale, dq_scale;
    if (f8) {
      const Fp8ProgramScales ps = load_descales(*f8, b, h, hk);
      s_scale = ps.scores;
      dp_scale = ps.dp;
      dq_scale = ps.sk * (1.0 / kDsScale);
    }
    for (auto m : tile(Sq, block("m"))) {
      Var dq_acc = zeros({m, D}, DType::f32);
      auto qt = q.load(b, h, m, all);
      auto dot_ = dout.load(b, h, m, all);
      // FP8: 2^4 P from the exponent and 2^12 dS = 2^4 P . 2^8 (dP - delta), the scales folded
      // into the row terms as the dK / dV kernel does.
      auto lse_m = f8 ? (masked_rows_lse(lse.load(b, h, m), hooks) - kQPLog2).col() : masked_rows_lse(lse.load(b, h, m), hooks).col();
      auto delta_m = f8 ? (delta.load(b, h, m) * kQDpScale).col() : delta.load(b, h, m).col();
      // Causal (top-left): the keys up to the tile's last row (all of them past Skv).
      const Operand n_end = !causal ? Operand(keys.length)
                            : keys.same_length ? Operand(m.end())
                                               : Operand(minimum(m.end(), keys.length));
      for (auto n : tile(n_end, block("n"))) {
        auto kt = k.load(b, hk, n, all);
        auto s = f8 ? dot(qt, kt.T()) * (scale * *s_scale) : dot(qt, kt.T()) * scale;
        std::optional<Tile> grad;   // a variant's d score_mod / d score
        if (hooks)
          s = apply_variant_hooks(*hooks->variant, s, [&] { return ScoreIndex{b, h, m.index().col(), n.index().row(), hooks->inputs}; },
                                  &grad);
        if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
        auto p = exp2(s - lse_m);
        if (f8) {
          auto dp = dot(dot_, v.load(b, hk, n, all).T()) * (*dp_scale * kQDpScale) - delta_m;
          auto ds = p * dp;   // 2^12 dS of the modded score
          if (grad) ds = ds * *grad;
          dq_acc = dot(ds.to(DType::e5m2), f8->kt->load(b, hk, all, n).T(), dq_acc);
        } else {
          auto ds = p * (dot(dot_, v.load(b, hk, n, all).T()) - delta_m);
          if (grad) ds = ds * *grad;
          dq_acc = dot(ds.to(q.dtype()), kt, dq_acc);
        }
      }
      if (f8) dq.store(b, h, m, all, (dq_acc * (scale * kLn2) * *dq_scale).to(dq.dtype()));
      else dq.store(b, h, m, all, (dq_acc * (scale * kLn2)).to(dq.dtype()));
    }
  }
}
}  // namespace

const Kernel& attention_bwd_dq() {
  static const Kernel k = kernel(
      "attention_bwd_dq", kDqParams,
      [](In q, In k, In v, In dout, In lse, In delta, Out dq, Scalar scale, bool causal) {
        query_tile_body(q, k, v, dout, lse, delta, dq, scale, causal);
      });
  return k;
}

const Kernel& attention_bwd_dkdv_fp8() {
  static const Kernel k = kernel(
      "attention_bwd_dkdv_fp8",
      kDkdvFp8Params,
      [](In q, In qt, In k, In v, In dout, In dout_t, In lse, In delta, In sq, In sk, In sv, In sdo, Out dk, Out dv, Scalar scale,
         bool causal) {
        const Fp8Inputs f8{&sq, &sk, &sv, &sdo, &qt, &dout_t, nullptr};
        key_tile_body(q, k, v, dout, lse, delta, dk, dv, nullptr, scale, causal, &f8);
      });
  return k;
}

const Kernel& attention_bwd_dq_fp8() {
  static const Kernel k = kernel(
      "attention_bwd_dq_fp8", kDqFp8Params,
      [](In q, In k, In kt, In v, In dout, In lse, In delta, In sq, In sk, In sv, In sdo, Out dq, Scalar scale, bool causal) {
        const Fp8Inputs f8{&sq, &sk, &sv, &sdo, nullptr, nullptr, &kt};
        query_tile_body(q, k, v, dout, lse, delta, dq, scale, causal, &f8);
      });
  return k;
}

namespace {
// Backward kernels of variants with AttentionVariant::fast_math (a softcap's tanh): their untuned
// config takes knob fast_math, as the forward's does.
std::mutex fast_math_mutex;
std::set<std::string>& fast_math_kernels() {
  static std::set<std::string> names;
  return names;
}

const bool variant_backward_config_registered = [] {
  codegen::register_default_config_provider("attention_variant_backward", [](const ir::Function& f, const std::string& arch) {
    std::optional<Config> c;
    {
      std::lock_guard<std::mutex> lock(fast_math_mutex);
      if (!fast_math_kernels().count(f.name)) return c;
    }
    c = codegen::mma_default_config(f, codegen::Target::parse(arch));
    if (c) c->knobs[codegen::knobs::fast_math.name] = 1;
    return c;
  });
  return true;
}();

}  // namespace

VariantBackward attention_variant_backward(const AttentionVariant& variant) {
  if (variant.name.empty()) throw Error("attention_variant_backward: the variant needs a name (it names the kernels)");
  if (variant.score_mod && !variant.score_grad)
    throw Error(fmt::format("attention variant '{}' has a score_mod without a score_grad (d score_mod / d score): no backward; "
                            "set AttentionVariant::score_grad (Tile() where the derivative is 1)",
                            variant.name));
  if (variant.merge_into_output)
    throw Error(fmt::format("attention variant '{}' merges into its output: the backward takes the non-merging variant with the "
                            "final output's LSE (dilated attention: dilated_attention_backward)",
                            variant.name));
  for (const std::string& l : variant.learnable)
    if (std::find(variant.inputs.begin(), variant.inputs.end(), l) == variant.inputs.end())
      throw Error(fmt::format("attention variant '{}': learnable input '{}' is not one of its inputs", variant.name, l));
  if (!variant.learnable.empty() && (!variant.param_grad || !variant.score_mod))
    throw Error(fmt::format("attention variant '{}' has learnable inputs without a {}: no gradient for them; set "
                            "AttentionVariant::param_grad (d modded / d input[h] per score)",
                            variant.name, variant.score_mod ? "param_grad" : "score_mod that reads them"));
  const std::string dkdv_name = variant.name + "_bwd_dkdv", dq_name = variant.name + "_bwd_dq";
  if (variant.fast_math) {
    std::lock_guard<std::mutex> lock(fast_math_mutex);
    for (const std::string& n : {dkdv_name, dq_name, dkdv_name + "_fp8", dq_name + "_fp8"}) fast_math_kernels().insert(n);
  }
  auto slots_of = [&](const std::vector<std::string>& names, size_t outputs_from, size_t outputs_to) {
    std::vector<Slot> slots;
    for (size_t i = 0; i < names.size(); ++i) {
      SlotKind kind = i >= outputs_from && i < outputs_to ? SlotKind::tensor_out : SlotKind::tensor_in;
      if (names[i] == "scale") kind = SlotKind::scalar_f32;
      if (names[i] == "causal") kind = SlotKind::host_bool;
      slots.push_back(Slot{names[i], kind});
    }
    for (const auto& in : variant.inputs) slots.push_back(Slot{in, SlotKind::tensor_in});
    return slots;
  };
  // dK / dV's kernels also write the learnable inputs' gradients, after the inputs.
  std::vector<Slot> dkdv_slots = slots_of(kDkdvParams, 6, 8), dkdv_fp8_slots = slots_of(kDkdvFp8Params, 12, 14);
  for (const auto& l : variant.learnable) {
    dkdv_slots.push_back(Slot{"d_" + l, SlotKind::tensor_out});
    dkdv_fp8_slots.push_back(Slot{"d_" + l, SlotKind::tensor_out});
  }
  // The variant's extra inputs follow the kernel's own arguments (from `first` on).
  auto hooks_of = [](const AttentionVariant& v, const detail::TraceArgs& a, size_t first) {
    VariantHooks hooks{&v, {}};
    for (size_t i = 0; i < v.inputs.size(); ++i) hooks.inputs.push_back(detail::make_arg<In>(a, first + i));
    return hooks;
  };
  Kernel::Body dkdv_body = [variant, hooks_of](const detail::TraceArgs& a) {
    using detail::make_arg;
    VariantHooks hooks = hooks_of(variant, a, kDkdvParams.size());
    for (size_t i = 0; i < variant.learnable.size(); ++i)
      hooks.param_grads.push_back(make_arg<Out>(a, kDkdvParams.size() + variant.inputs.size() + i));
    key_tile_body(make_arg<In>(a, 0), make_arg<In>(a, 1), make_arg<In>(a, 2), make_arg<In>(a, 3), make_arg<In>(a, 4),
                  make_arg<In>(a, 5), make_arg<Out>(a, 6), make_arg<Out>(a, 7), nullptr, make_arg<Scalar>(a, 8),
                  make_arg<bool>(a, 9), nullptr, &hooks);
  };
  Kernel::Body dq_body = [variant, hooks_of](const detail::TraceArgs& a) {
    using detail::make_arg;
    const VariantHooks hooks = hooks_of(variant, a, kDqParams.size());
    query_tile_body(make_arg<In>(a, 0), make_arg<In>(a, 1), make_arg<In>(a, 2), make_arg<In>(a, 3), make_arg<In>(a, 4),
                    make_arg<In>(a, 5), make_arg<Out>(a, 6), make_arg<Scalar>(a, 7), make_arg<bool>(a, 8), nullptr, &hooks);
  };
  Kernel::Body dkdv_fp8_body = [variant, hooks_of](const detail::TraceArgs& a) {
    using detail::make_arg;
    VariantHooks hooks = hooks_of(variant, a, kDkdvFp8Params.size());
    for (size_t i = 0; i < variant.learnable.size(); ++i)
      hooks.param_grads.push_back(make_arg<Out>(a, kDkdvFp8Params.size() + variant.inputs.size() + i));
    const In qt = make_arg<In>(a, 1), dout_t = make_arg<In>(a, 5), sq = make_arg<In>(a, 8), sk = make_arg<In>(a, 9),
             sv = make_arg<In>(a, 10), sdo = make_arg<In>(a, 11);
    const Fp8Inputs f8{&sq, &sk, &sv, &sdo, &qt, &dout_t, nullptr};
    key_tile_body(make_arg<In>(a, 0), make_arg<In>(a, 2), make_arg<In>(a, 3), make_arg<In>(a, 4), make_arg<In>(a, 6),
                  make_arg<In>(a, 7), make_arg<Out>(a, 12), make_arg<Out>(a, 13), nullptr, make_arg<Scalar>(a, 14),
                  make_arg<bool>(a, 15), &f8, &hooks);
  };
  Kernel::Body dq_fp8_body = [variant, hooks_of](const detail::TraceArgs& a) {
    using detail::make_arg;
    const VariantHooks hooks = hooks_of(variant, a, kDqFp8Params.size());
    const In kt = make_arg<In>(a, 2), sq = make_arg<In>(a, 7), sk = make_arg<In>(a, 8), sv = make_arg<In>(a, 9),
             sdo = make_arg<In>(a, 10);
    const Fp8Inputs f8{&sq, &sk, &sv, &sdo, nullptr, nullptr, &kt};
    query_tile_body(make_arg<In>(a, 0), make_arg<In>(a, 1), make_arg<In>(a, 3), make_arg<In>(a, 4), make_arg<In>(a, 5),
                    make_arg<In>(a, 6), make_arg<Out>(a, 11), make_arg<Scalar>(a, 12), make_arg<bool>(a, 13), &f8, &hooks);
  };
  return VariantBackward{variant.name,
                         variant.inputs.size(),
                         variant.learnable.size(),
                         Kernel(dkdv_name, std::move(dkdv_slots), std::move(dkdv_body), Loc::current()),
                         Kernel(dq_name, slots_of(kDqParams, 6, 7), std::move(dq_body), Loc::current()),
                         Kernel(dkdv_name + "_fp8", std::move(dkdv_fp8_slots), std::move(dkdv_fp8_body), Loc::current()),
                         Kernel(dq_name + "_fp8", slots_of(kDqFp8Params, 11, 12), std::move(dq_fp8_body), Loc::current())};
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
// out (+)= the sum of each group's per-query-head shares: part [B, H, S, D] f32 -> out [B, Hkv,
// S, D], kv head hk summing query heads hk·G .. hk·G + G - 1 (G = H / Hkv) in order.
template <class Dest>
void group_sum_body(const In& part, const Dest& out, bool add) {
  auto [B, H, S, D] = part.shape<4>();
  auto Hkv = out.dim(1);
  auto G = H / Hkv;
  for (auto bk : grid(B * Hkv)) {
    auto b = floordiv(bk, Hkv), hk = bk % Hkv;
    for (auto s : tile(S, block("s"))) {
      Var acc = zeros({s, D}, DType::f32);
      for (auto g : grid(G)) acc = acc + part.load(b, hk * G + g, s, all).to(DType::f32);   // in order: reproducible
      if (add) acc = acc + out.load(b, hk, s, all).to(DType::f32);
      out.store(b, hk, s, all, Tile(acc).to(out.dtype()));
    }
  }
}
}  // namespace

const Kernel& attention_bwd_group_sum() {
  static const Kernel k =
      kernel("attention_bwd_group_sum", {"part", "out"}, [](In part, Out out) { group_sum_body(part, out, false); });
  return k;
}

const Kernel& attention_bwd_group_add() {
  static const Kernel k =
      kernel("attention_bwd_group_add", {"part", "out"}, [](In part, InOut out) { group_sum_body(part, out, true); });
  return k;
}

namespace {

void check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& dout,
                  const TensorView& lse, const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  auto fail = [](const std::string& why) { throw Error("attention backward: " + why); };
  if (q.rank() != 4) fail(fmt::format("q is {}: expected [B, H, S, D]", q.describe()));
  if (k.rank() != 4 || k.shape[0] != q.shape[0] || k.shape[3] != q.shape[3] || k.shape[1] < 1 || q.shape[1] % k.shape[1] != 0)
    fail(fmt::format("k is {}: expected [B, Hkv, Skv, D] with q's B and D and Hkv dividing q's {} heads (q is {})", k.describe(),
                     q.shape[1], q.describe()));
  const std::pair<const char*, const TensorView*> like_q[] = {{"o", &o}, {"do", &dout}, {"dq", &dq}};
  for (const auto& [what, t] : like_q)
    if (t->shape != q.shape) fail(fmt::format("{} is {}: expected the shape of q, {}", what, t->describe(), q.describe()));
  const std::pair<const char*, const TensorView*> like_k[] = {{"v", &v}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& [what, t] : like_k)
    if (t->shape != k.shape) fail(fmt::format("{} is {}: expected the shape of k, {}", what, t->describe(), k.describe()));
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) fail(fmt::format("q is {}: expected bf16 or f16", q.describe()));
  for (const auto& [what, t] : {std::pair<const char*, const TensorView*>{"k", &k}, {"v", &v}, {"o", &o}, {"do", &dout}})
    if (t->dtype != q.dtype) fail(fmt::format("{} is {}: expected q's dtype, {}", what, t->describe(), tj::name(q.dtype)));
  for (const auto& [what, t] : {std::pair<const char*, const TensorView*>{"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
    if (!is_float(t->dtype) || is_fp8(t->dtype)) fail(fmt::format("{} is {}: expected f32, bf16 or f16", what, t->describe()));
  if (lse.dtype != DType::f32 || lse.shape != std::vector<int64_t>{q.shape[0], q.shape[1], q.shape[2]})
    fail(fmt::format("lse is {}: expected f32[{}, {}, {}] (the forward's)", lse.describe(), q.shape[0], q.shape[1], q.shape[2]));
}

// x [B, H, S, D] -> e4m3 y (and its transpose yt [B, H, D, S_pad] when asked) with descale [B, H]
// = amax / 448 per (b, h): the chunk amaxes once, then each copy from them.
void quantize_with_transpose(const TensorView& x, std::optional<DeviceTensor>& y, std::optional<DeviceTensor>* yt,
                             std::optional<DeviceTensor>& descale, std::optional<DeviceTensor>& chunks, const LaunchOptions& lo) {
  const std::vector<int64_t> heads = {x.shape[0], x.shape[1]};
  const std::vector<int64_t> t_shape = {x.shape[0], x.shape[1], x.shape[3], (x.shape[2] + 15) / 16 * 16};
  if (!y || y->shape() != x.shape) y.emplace(DType::e4m3, x.shape);
  if (!descale || descale->shape() != heads) descale.emplace(DType::f32, heads);
  const TensorView amaxes = chunk_amaxes(x, chunks, lo);
  if (!yt) return quantize_with_chunk_amaxes(x, amaxes, y->view(), descale->view(), false, lo);
  if (!*yt || (*yt)->shape() != t_shape) yt->emplace(DType::e4m3, t_shape);
  quantize_both_with_chunk_amaxes(x, amaxes, y->view(), (*yt)->view(), descale->view(), lo);   // one read of x for both
}

// The FP8 backward's operands, quantized into the workspace on lo's stream.
BackwardFp8Views quantize_backward_operands(const TensorView& q, const TensorView& k, const TensorView& v,
                                            const TensorView& dout, AttentionBackwardWorkspace& ws, const LaunchOptions& lo) {
  quantize_with_transpose(q, ws.q8, &ws.qt8, ws.sq, ws.amax_chunks, lo);
  quantize_with_transpose(k, ws.k8, &ws.kt8, ws.sk, ws.amax_chunks, lo);
  quantize_with_transpose(v, ws.v8, nullptr, ws.sv, ws.amax_chunks, lo);
  quantize_with_transpose(dout, ws.do8, &ws.dot8, ws.sdo, ws.amax_chunks, lo);
  return {ws.q8->view(), ws.qt8->view(), ws.k8->view(), ws.kt8->view(), ws.v8->view(), ws.do8->view(), ws.dot8->view(),
          ws.sq->view(),  ws.sk->view(),  ws.sv->view(), ws.sdo->view()};
}

}  // namespace

std::vector<BackwardLaunch> attention_backward_launches(const TensorView& q, const TensorView& k, const TensorView& v,
                                                        const TensorView& o, const TensorView& dout, const TensorView& lse,
                                                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                                        const AttentionBackwardOptions& opt, const TensorView& delta,
                                                        const TensorView& lse2, const std::optional<TensorView>& dq_acc,
                                                        const std::optional<TensorView>& dk_part,
                                                        const std::optional<TensorView>& dv_part,
                                                        const std::optional<BackwardFp8Views>& fp8) {
  check_inputs(q, k, v, o, dout, lse, dq, dk, dv);
  if (opt.fp8 && !opt.deterministic)
    throw Error("attention backward: the FP8 backward runs as three kernels only: set deterministic (no fused pass yet)");
  if (opt.fp8 != fp8.has_value())
    throw Error(opt.fp8 ? "attention backward: fp8 needs the e4m3 operands (BackwardFp8Views)"
                        : "attention backward: e4m3 operands given without opt.fp8");
  if (!opt.deterministic && !dq_acc) throw Error("attention backward: the fused pass needs its dq_acc scratch");
  if (opt.variant) {
    if (!opt.deterministic)
      throw Error(fmt::format("attention backward of variant '{}': three kernels only: set deterministic (no fused pass of variants yet)",
                              opt.variant->name));
    if (opt.variant_inputs.size() != opt.variant->inputs)
      throw Error(fmt::format("attention backward of variant '{}': it takes {} extra input(s) (the forward's), got {}", opt.variant->name,
                              opt.variant->inputs, opt.variant_inputs.size()));
    if (opt.variant_param_grads.size() != opt.variant->learnable)
      throw Error(fmt::format("attention backward of variant '{}': it has {} learnable input(s), whose gradients "
                              "variant_param_grads must hold (f32 [{}] each), got {}",
                              opt.variant->name, opt.variant->learnable, q.shape[1], opt.variant_param_grads.size()));
    for (const TensorView& g : opt.variant_param_grads)
      if (g.dtype != DType::f32 || g.shape != std::vector<int64_t>{q.shape[1]} || !g.is_contiguous())
        throw Error(fmt::format("attention backward of variant '{}': a learnable input's gradient is {}: expected contiguous "
                                "f32[{}] (one per query head)",
                                opt.variant->name, g.describe(), q.shape[1]));
  } else if (!opt.variant_inputs.empty() || !opt.variant_param_grads.empty()) {
    throw Error("attention backward: variant inputs or parameter gradients given without a variant");
  }
  const int64_t groups = q.shape[1] / k.shape[1];
  const std::vector<int64_t> part_shape = {q.shape[0], q.shape[1], k.shape[2], k.shape[3]};
  if (groups > 1)
    for (const auto& [what, t] : {std::pair<const char*, const std::optional<TensorView>*>{"dk_part", &dk_part}, {"dv_part", &dv_part}})
      if (!*t || (*t)->dtype != DType::f32 || (*t)->shape != part_shape)
        throw Error(fmt::format("attention backward: grouped-query heads ({} query heads per kv head) need the {} scratch, f32[{}, "
                                "{}, {}, {}]{}",
                                groups, what, part_shape[0], part_shape[1], part_shape[2], part_shape[3],
                                *t ? fmt::format(", got {}", (*t)->describe()) : std::string()));
  const TensorView gk = groups > 1 ? *dk_part : dk, gv = groups > 1 ? *dv_part : dv;   // per query head
  const double scale = 1.4426950408889634 * opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(q.shape[3])));
  std::vector<BackwardLaunch> out;
  if (fp8) out.push_back({&attention_bwd_prepare_fp8(), {o, fp8->do8, fp8->sdo, lse, delta, lse2}});
  else out.push_back({&attention_bwd_prepare(), {o, dout, lse, delta, lse2}});
  if (fp8 && !opt.variant) {
    const BackwardFp8Views& f = *fp8;
    out.push_back({&attention_bwd_dkdv_fp8(),
                   {f.q8, f.qt8, f.k8, f.v8, f.do8, f.dot8, lse2, delta, f.sq, f.sk, f.sv, f.sdo, gk, gv, scale, opt.causal}});
    out.push_back({&attention_bwd_dq_fp8(),
                   {f.q8, f.k8, f.kt8, f.v8, f.do8, lse2, delta, f.sq, f.sk, f.sv, f.sdo, dq, scale, opt.causal}});
  } else if (opt.variant) {
    std::vector<Arg> dkdv_args = {q, k, v, dout, lse2, delta, gk, gv, scale, opt.causal};
    std::vector<Arg> dq_args = {q, k, v, dout, lse2, delta, dq, scale, opt.causal};
    if (fp8) {
      const BackwardFp8Views& f = *fp8;
      dkdv_args = {f.q8, f.qt8, f.k8, f.v8, f.do8, f.dot8, lse2, delta, f.sq, f.sk, f.sv, f.sdo, gk, gv, scale, opt.causal};
      dq_args = {f.q8, f.k8, f.kt8, f.v8, f.do8, lse2, delta, f.sq, f.sk, f.sv, f.sdo, dq, scale, opt.causal};
    }
    for (const TensorView& in : opt.variant_inputs) {
      dkdv_args.push_back(in);
      dq_args.push_back(in);
    }
    // The learnable inputs' gradients: zeroed, then added into by the dK / dV kernel's programs.
    for (const TensorView& g : opt.variant_param_grads) {
      out.push_back({&fill_zeros(), {g}});
      dkdv_args.push_back(g);
    }
    out.push_back({fp8 ? &opt.variant->dkdv_fp8 : &opt.variant->dkdv, std::move(dkdv_args)});
    out.push_back({fp8 ? &opt.variant->dq_fp8 : &opt.variant->dq, std::move(dq_args)});
  } else if (opt.deterministic) {
    out.push_back({&attention_bwd_dkdv(), {q, k, v, dout, lse2, delta, gk, gv, scale, opt.causal}});
    out.push_back({&attention_bwd_dq(), {q, k, v, dout, lse2, delta, dq, scale, opt.causal}});
  } else {
    out.push_back({&attention_bwd_fused(), {q, k, v, dout, lse2, delta, gk, gv, *dq_acc, scale, opt.causal}});
    out.push_back({&attention_bwd_dq_convert(), {*dq_acc, dq}});
  }
  if (groups > 1) {
    out.push_back({&attention_bwd_group_sum(), {gk, dk}});
    out.push_back({&attention_bwd_group_sum(), {gv, dv}});
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
  std::optional<TensorView> acc, dk_part, dv_part;
  if (!opt.deterministic) {
    if (!ws.dq_acc || ws.dq_acc->shape() != q.shape) ws.dq_acc.emplace(DType::f32, q.shape);
    ws.dq_acc->fill_bytes_async(0, opt.stream);
    acc = ws.dq_acc->view();
  }
  if (q.shape[1] != k.shape[1]) {
    const std::vector<int64_t> part = {q.shape[0], q.shape[1], k.shape[2], k.shape[3]};
    for (auto* t : {&ws.dk_part, &ws.dv_part})
      if (!*t || (*t)->shape() != part) t->emplace(DType::f32, part);
    dk_part = ws.dk_part->view();
    dv_part = ws.dv_part->view();
  }
  LaunchOptions lo;
  lo.stream = opt.stream;
  std::optional<BackwardFp8Views> f8;
  if (opt.fp8) {
    if (!opt.deterministic)
      throw Error("attention backward: the FP8 backward runs as three kernels only: set deterministic (no fused pass yet)");
    f8 = quantize_backward_operands(q, k, v, dout, ws, lo);
  }
  for (const BackwardLaunch& l : attention_backward_launches(q, k, v, o, dout, lse, dq, dk, dv, opt, ws.delta->view(),
                                                             ws.lse2->view(), acc, dk_part, dv_part, f8))
    launch(*l.kernel, l.args, lo);
}

namespace {
// The backward of a window launch's shifted_window_variant (its delta), built once and kept.
const VariantBackward& ring_window_backward(int64_t window, int64_t delta) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<VariantBackward>> kernels;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<VariantBackward>& b = kernels[{window, delta}];
  if (!b) b = std::make_unique<VariantBackward>(attention_variant_backward(shifted_window_variant(window, delta)));
  return *b;
}
}  // namespace

std::vector<BackwardLaunch> ring_backward_step_launches(const RingPlan& plan, int64_t rank, int64_t step, const RingBackwardViews& v) {
  const int64_t L = plan.chunk_rows();
  if (plan.window > 0 && (v.dq_part.rank() != 4 || v.dq_part.dtype != DType::f32 || v.dq_part.shape != v.dk_part.shape))
    throw Error(fmt::format("ring attention backward: a sliding window needs the dq_part scratch, f32 like dk_part ({}), got {} ({})",
                            v.dk_part.describe(), v.dq_part.rank() ? v.dq_part.describe() : std::string("none"), plan.describe()));
  std::vector<BackwardLaunch> out;
  for (const RingPlan::Launch& l : plan.launches(rank, step)) {
    // The launch's rows: its query rows of the chunk and its keys of the held chunk (a window
    // launch: the part the window reaches), and as many rows of the scratch.
    const int64_t q0 = l.q_chunk * L + l.q_begin, rows = l.q_end - l.q_begin;
    const int64_t k0 = l.kv_chunk * L + l.kv_begin, keys = l.kv_end - l.kv_begin;
    auto qs = [&](const TensorView& t) { return slice_of(t, 2, q0, rows); };
    auto ks = [&](const TensorView& t) { return slice_of(t, 2, k0, keys); };
    const TensorView dk_part = slice_of(v.dk_part, 2, 0, keys), dv_part = slice_of(v.dv_part, 2, 0, keys);
    if (l.mode == RingPlan::Mode::window) {
      // The window's mask shifted by the pair's offset: its dK / dV and dQ kernels (no fused form),
      // dQ through the scratch into dq_acc's rows.
      const VariantBackward& b = ring_window_backward(plan.window, l.delta);
      const TensorView dq_part = slice_of(v.dq_part, 2, 0, rows);
      out.push_back({&b.dkdv, {qs(v.q), ks(v.k), ks(v.v), qs(v.dout), qs(v.lse2), qs(v.delta), dk_part, dv_part, v.scale, false}});
      out.push_back({&b.dq, {qs(v.q), ks(v.k), ks(v.v), qs(v.dout), qs(v.lse2), qs(v.delta), dq_part, v.scale, false}});
      out.push_back({&accumulate(), {qs(v.dq_acc), dq_part}});
    } else {
      out.push_back({&attention_bwd_fused(),
                     {qs(v.q), ks(v.k), ks(v.v), qs(v.dout), qs(v.lse2), qs(v.delta), dk_part, dv_part, qs(v.dq_acc), v.scale,
                      l.mode == RingPlan::Mode::causal}});
    }
    // Grouped-query heads: the parts are per query head, each group's sum added into the kv head's.
    for (const auto& [acc, part] : {std::pair{v.dk_acc, dk_part}, std::pair{v.dv_acc, dv_part}}) {
      if (part.shape[1] == v.k.shape[1]) out.push_back({&accumulate(), {ks(acc), part}});
      else out.push_back({&attention_bwd_group_add(), {part, ks(acc)}});
    }
  }
  return out;
}

}  // namespace tj::kernels
