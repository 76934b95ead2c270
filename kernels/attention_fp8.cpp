// Scaled FP8 flash attention forward, in the DSL (FlashAttention-3's FP8 recipe). The same
// source serves e4m3 and bf16/f16 inputs (host `if`s specialize the trace).
//
//   q [B, H, Sq, D], k [B, Hkv, Skv, D]; fp8: v given TRANSPOSED, vt [B, Hkv, D, Skv_pad]
//   (quantize_transpose_fp8 writes it; FP8 wgmma needs both P·V operands K-major), 16-bit:
//   v [B, Hkv, Skv, D] natural. Hkv divides H (grouped-query attention: head h reads kv head
//   h / (H / Hkv)).
//   q_descale [B, H], k_descale and v_descale [B, Hkv] f32: x_true = x_fp8 * descale, Q's per
//   query head, K's and V's per kv head (per-tensor scaling is the broadcast case: every entry
//   equal, or a view with strides 0). 16-bit inputs pass ones.
//   o [B, H, Sq, D] (bf16, f16, or e4m3 -- then o = e4m3(O * o_scale)); lse [B, H, Sq] f32,
//   written when `with_lse` (natural-log logsumexp of the scaled scores; else any tensor).
//   scale: softmax scale * log2(e) (e.g. log2(e)/sqrt(D)), a runtime scalar.
//
// Head dims: q and k share one (Dqk), v and o another (Dv); usually equal, Dqk = 2 Dv for the
// Q-residual scheme (kernels/attention_fp8.h).
//
// Numerics: the q·k descales and the scale fold into one constant per (b, h); scores and the
// online softmax are f32 in exp2; P = exp2(s - (m - 8)) is quantized to the input type for the
// second dot; l sums that quantized P in fp8 kernels without an LSE (the weights of V's rows sum
// to 1), the f32 P otherwise (O and the LSE, the scores' logsumexp, share it), so the offset
// cancels in acc / l; the V descale folds
// into that final normalization. Lazy rescaling: the running max m moves only when a block's max
// passes it by more than a slack (0.75 fp8, 8 in 16-bit), so P lies in [0, 2^8.75] (fp8: up to 430,
// e4m3's full relative precision and below its 448) or [0, 2^8] (16-bit, offset 0). Causal
// masking is top-left aligned (key j <= query i). Rows that see no key (masks) get O = 0 and
// lse = -inf: the running max is used as 0 while it is -inf.
//
// Variants (kernels/attention_variant.h) trace their hooks right after the scores: score_mod on
// the natural-log score, then mask_mod as where(keep, s, -inf).
//
// On sm_90a, codegen/lower_attention_sm90.cpp recognizes this kernel and lowers it to the
// warp-specialized TMA + wgmma main loop of codegen/device/hopper_attention.cuh (block "n" is
// the key block BN, block "m" the query tile: 128 = 2 consumer warpgroups, 192 = 3); other
// targets (and config knob lowering = 0) take the SIMT path, the CPU reference executor runs it
// as written.
#include "kernels/attention_fp8.h"

#include <map>
#include <mutex>
#include <fmt/format.h>

#include <cmath>

#include "codegen/lowering.h"
#include "codegen/attention_knobs.h"
#include "codegen/emitter_knobs.h"
#include "codegen/lower_attention_sm90.h"
#include "codegen/target.h"
#include "kernels/attention_variant.h"
#include "kernels/library.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"

namespace tj::kernels {

namespace {

constexpr double kLn2 = 0.6931471805599453;
constexpr double kLog2e = 1.4426950408889634;

// The kernel body, shared by attention_fp8 (no hooks) and attention_variant.
void attention_body(In q, In k, In v, In q_descale, In k_descale, In v_descale, Out o, Out lse, Scalar scale,
                    Scalar o_scale, bool causal, bool with_lse, const AttentionVariant* hooks,
                    const std::vector<In>& inputs) {
  const bool fp8 = is_fp8(q.dtype());
  const bool merging = hooks && hooks->merge_into_output;
  if (merging && !with_lse)
    throw Error(fmt::format("attention variant '{}' merges into its output: launch it with with_lse = true (lse holds "
                            "the running logsumexp)",
                            hooks->name));
  if (merging && is_fp8(o.dtype()))
    throw Error(fmt::format("attention variant '{}' merges into its output: o must be bf16 or f16, not {}", hooks->name,
                            name(o.dtype())));
  const double p_offset = fp8 ? 8.0 : 0.0;   // P in [0, 2^8]: e4m3's range, full precision
  // The running max moves only when a block's max passes it by more than this: P then stays in
  // [0, 2^(offset + slack)] (fp8: 430 < 448, e4m3's largest), and on the GPU most blocks skip the
  // rescale of O (alpha = 1 in every row of a warp).
  const double rescale_slack = fp8 ? 0.75 : 8.0;
  auto [B, H, S, D] = q.shape<4>();
  auto Dv = fp8 ? v.dim(2) : v.dim(3);
  auto Hkv = k.dim(1);
  auto S_kv = k.dim(2);
  for (auto bh : grid(B * H)) {
    auto b = floordiv(bh, H);
    auto h = bh % H;
    auto hk = floordiv(h, floordiv(H, Hkv));
    auto qk_scale = scale * q_descale.load(b, h) * k_descale.load(b, hk);   // one constant
    auto v_scale = v_descale.load(b, hk);
    for (auto m : tile(S, block("m"))) {
      Var m_i = full({m}, -INFINITY, DType::f32);
      Var l_i = zeros({m}, DType::f32);
      Var acc = zeros({m, Dv}, DType::f32);
      auto qt = q.load(b, h, m, all);
      for (auto n : tile(causal ? minimum(m.end(), S_kv) : S_kv, block("n"))) {
        auto s = dot(qt, k.load(b, hk, n, all).T()) * qk_scale;
        if (causal) s = where(m.index().col() >= n.index().row(), s, -INFINITY);
        if (hooks) s = apply_variant_hooks(*hooks, s, [&] { return ScoreIndex{b, h, m.index().col(), n.index().row(), inputs}; });
        auto m_blk = maximum(m_i, amax(s, 1));
        auto m_new = where(m_blk > m_i + rescale_slack, m_blk, m_i);   // lazy rescaling
        auto m_use = where(m_new == -INFINITY, 0.0, m_new);   // no key yet: exp2(-inf - 0) = 0
        auto p = exp2(s - (m_use - p_offset).col());
        auto alpha = exp2(m_i - m_use);
        auto p_in = p.to(q.dtype());   // the P the second dot multiplies
        // fp8 without an LSE: l sums that e4m3 P, so that the weights of V's rows sum to 1 (sm_90a:
        // on the tensor cores); so does a merging variant's, whose LSE then weighs its part as O
        // weighs the keys. Otherwise the f32 P: O and the LSE (the scores' logsumexp) share it.
        l_i = l_i * alpha + sum(fp8 && (!with_lse || merging) ? p_in.to(DType::f32) : p, 1);
        auto vn = fp8 ? v.load(b, hk, all, n).T() : v.load(b, hk, n, all);
        acc = dot(p_in, vn, acc * alpha.col());
        m_i = m_new;
      }
      auto out = acc * where(l_i > 0.0, v_scale / l_i, 0.0).col();
      if (is_fp8(o.dtype())) out = out * o_scale;
      auto part_lse = (m_i - p_offset + log2(l_i)) * kLn2;
      if (merging) {
        // o and lse hold the rows' attention over other keys (lse -inf: none yet, whatever o holds);
        // both become the attention over those keys and these, weighed by the two logsumexps.
        auto old_lse = lse.load(b, h, m);
        auto top = maximum(old_lse, part_lse);
        auto top_safe = where(top == -INFINITY, 0.0, top);
        auto w_part = exp(part_lse - top_safe), w_old = exp(old_lse - top_safe);
        auto den = w_part + w_old;
        auto inv_den = where(den > 0.0, 1.0 / den, 0.0);
        auto old_o = where((w_old > 0.0).col(), o.load(b, h, m, all).to(DType::f32), 0.0);
        out = out * (w_part * inv_den).col() + old_o * (w_old * inv_den).col();
        o.store(b, h, m, all, out.to(o.dtype()));
        lse.store(b, h, m, top_safe + log(den));
      } else {
        o.store(b, h, m, all, out.to(o.dtype()));
        if (with_lse) lse.store(b, h, m, part_lse);
      }
    }
  }
}

const std::vector<std::string> kParamNames = {"q",         "k", "v",   "q_descale", "k_descale", "v_descale",
                                              "o",         "lse", "scale", "o_scale", "causal",   "with_lse"};

}  // namespace

const Kernel& attention_fp8() {
  static const Kernel k = kernel(
      "attention_fp8", kParamNames,
      [](In q, In k, In v, In q_descale, In k_descale, In v_descale, Out o, Out lse, Scalar scale, Scalar o_scale,
         bool causal, bool with_lse) {
        attention_body(q, k, v, q_descale, k_descale, v_descale, o, lse, scale, o_scale, causal, with_lse, nullptr, {});
      });
  return k;
}

const Kernel& attention_fp8_merging() {
  static const Kernel k = [] {
    AttentionVariant merging{"attention_fp8_merging"};
    merging.merge_into_output = true;
    return attention_variant(merging);
  }();
  return k;
}

namespace {

std::mutex variant_defaults_mutex;
// What a variant kernel's default configs take from its AttentionVariant.
struct VariantDefaults {
  int64_t any = 0, fp8 = 0;   // attention_variant_key_block's and attention_variant_fp8_key_block's
  bool fast_math = false;     // AttentionVariant::fast_math
  bool score_mod_block = false;   // `any` is the 128 of a score_mod without a key block of its own
  bool uniform_work = false;  // AttentionVariant::uniform_work
  bool merging = false;       // AttentionVariant::merge_into_output
};
std::map<std::string, VariantDefaults>& variant_defaults() {
  static std::map<std::string, VariantDefaults> m;
  return m;
}
VariantDefaults variant_defaults_of(const std::string& kernel_name) {
  std::lock_guard<std::mutex> lock(variant_defaults_mutex);
  auto it = variant_defaults().find(kernel_name);
  return it == variant_defaults().end() ? VariantDefaults{} : it->second;
}

}  // namespace

int64_t attention_variant_key_block(const std::string& kernel_name) { return variant_defaults_of(kernel_name).any; }

int64_t attention_variant_fp8_key_block(const std::string& kernel_name) { return variant_defaults_of(kernel_name).fp8; }

Config attention_variant_default_config(const std::string& kernel_name, DType in, int64_t head_dim, bool causal,
                                        int64_t qk_head_dim, int64_t seq_kv, bool with_lse) {
  const VariantDefaults kb = variant_defaults_of(kernel_name);
  if (kb.merging) with_lse = false;   // its row sums are the e4m3 P's, as without an LSE
  // A score hook's key block of 128 (fp8: 64 x 128 tiles) holds up to 4096 keys; longer rows take
  // the long-row tiles, 192 x 96 (H100, causal S 8192 fp8, with causal tiles longest
  // first over groups of heads: ALiBi 763 vs 746 TFLOP/s, softcap 637-642 vs 606-613; at S 2048
  // 64 x 128 stays ahead, ALiBi 579-582 vs 560-562).
  // fp8 up to 4096 keys: 64 x 64 tiles (three CTAs per SM) instead (H200, keys by
  // parity, S 1024 / 2048 / 4096: ALiBi 526-530 / 649-651 / 728 vs 453-455 / 588-589 / 687-688 TFLOP/s,
  // softcap 465-468 / 552 / 600-601 vs 406-408 / 504-507 / 575).
  const int64_t key_block = !kb.score_mod_block || !is_fp8(in) ? kb.any : seq_kv > 4096 ? 0 : seq_kv > 0 ? 64 : kb.any;
  Config c = attention_fp8_default_config(in, head_dim, causal, qk_head_dim, key_block, seq_kv, kb.fp8);
  if (kb.fast_math) c.knobs["fast_math"] = 1;
  // A fast_math hook's approximations (softcap's tanh) share the MUFU with the softmax's exp2s: on
  // fp8 192-row tiles some exp2s move to the FMA pipes. One of every 8 where the kernel writes the
  // LSE (exp2_fma in f32: H200, softcap causal S 8192, 192 x 96: 655.8 vs 630.5 TFLOP/s;
  // 2 of 8: 629.2), four without one (pairs in f16x2 for the e4m3 P, knob attn_exp2_f16: H200,
  // same shape, two alternations: 1 / 2 / 3 / 4 of 8: 667.4, 662.9 / 663.1, 667.9 / 661.5, 663.7
  // / 673.4, 668.0; f32, 1 of 8: 657.6, 653.2).
  // On fp8 64 x 64 tiles with a producer warp (up to 4096 keys) two of 8 without an LSE (H200,
  // softcap causal S 2048, two alternations: 574.7, 573.9 vs 556.4, 556.8; 4 of 8: 566.1, 565.0; the
  // variants without a score hook lost 1-4% at 2 of 8 on these tiles).
  if (kb.fast_math && is_fp8(in) && c.blocks.at("m") == 192) c.knobs["attn_exp2_fma"] = with_lse || head_dim != 128 ? 1 : 4;
  if (kb.fast_math && is_fp8(in) && !with_lse && head_dim == 128 && c.blocks.at("m") == 64 && c.blocks.at("n") == 64 &&
      codegen::knobs::attn_lean_producer.of(c) == 1)
    c.knobs["attn_exp2_fma"] = 2;
  if (kb.uniform_work) {
    c.knobs["attn_reverse_tiles"] = 0;
    if (is_fp8(in) && c.blocks.at("m") == 64 && c.blocks.at("n") == 128 && head_dim <= 128 && qk_head_dim <= 128) {
      c.knobs["attn_lean_producer"] = 1;
      c.knobs["attn_overlap"] = 0;
      // Without the producer warp (attn_self_load), three CTAs an SM (H100, segments of
      // 2048 keys at S 2048 / 8192, fp8 ms, three alternations: 0.338-0.339 / 0.338-0.340 vs 0.342-0.344 /
      // 0.342-0.343 with the producer warp). Merging ones too (dilated attention's masked pairs:
      // H200, dilated S 8192 0.574-0.575 vs 0.584-0.585 ms; with a block table of more than 128
      // blocks only two fit an SM, and they ran slower than with the producer warp: 0.609 ms).
      c.knobs["attn_self_load"] = 1;
    }
  }
  // fp8 64 x 128 tiles with a producer warp and no overlap (dense rows of up to 2048 keys, uniform
  // work) and no LSE: exp2s off the MUFU, in f16x2 pairs, 2 of every 8 for dense rows, 3 for uniform
  // work (H200, S 2048, two calls of two alternations: dense 826-831 vs 809-814 TFLOP/s,
  // segments of 2048 791-796 vs 780-785; 1 of 8: dense 831-832, segments 767-770; 3: 808-810 /
  // 794-800; 4: 805-806 / 775-777; a third call, segments at S 2048 and 8192, three alternations:
  // 3 of 8 794-799 vs 2 of 8 789-794).
  // (Head dim 128, where it was measured.)
  if (!with_lse && is_fp8(in) && head_dim == 128 && c.blocks.at("m") == 64 && c.blocks.at("n") == 128 &&
      codegen::knobs::attn_lean_producer.of(c) == 1 && codegen::knobs::attn_overlap.of(c) == 0 && !c.knobs.count("attn_exp2_fma"))
    c.knobs["attn_exp2_fma"] = kb.uniform_work ? 3 : 2;
  // Plain 16-bit attention (no hooks: a persistent kernel takes none) without an LSE, not causal,
  // over rows of up to 4096 keys (m128 n128): a persistent
  // launch (knob attn_persistent), which pays a CTA's start once and stores O through staging rows
  // of its own while the next tile's loads run (H200, ms, two alternations, one CTA per
  // tile vs persistent: bf16 S 1024 / 2048 / 4096 0.2505, 0.2501 / 0.4232, 0.4252 / 0.7738, 0.7767
  // vs 0.2292, 0.2300 / 0.4075, 0.4092 / 0.7655, 0.7674, D 64 S 2048 0.6807, 0.6853 vs 0.6591,
  // 0.6599; fp8 S 1024 / 2048 0.1914, 0.1915 / 0.3384, 0.3381 vs 0.1891, 0.1885 / 0.3344, 0.3349.
  // Longer rows lose: bf16 S 16384 2.908, 3.187 vs 2.955, 3.214; fp8 192 x 96 S 4096 / 16384
  // 0.628, 0.630 / 2.321, 2.360 vs 0.636, 0.633 / 2.360, 2.398.) Causal tiles keep their
  // longest-first order; dilated attention's pairs (an LSE, merges) keep a CTA per tile. fp8's
  // 64 x 128 tiles over up to 2048 keys load their own K and V instead of a persistent launch
  // (attn_self_load, one tile a CTA: attention_fp8_default_config), 5.5% faster at 2048 keys.
  const bool plain = kernel_name.empty() || kernel_name == "attention_fp8";
  const bool short_rows = !is_fp8(in) && c.blocks.at("m") == 128 && c.blocks.at("n") == 128 && seq_kv <= 4096;
  if (plain && !with_lse && !causal && seq_kv > 0 && head_dim <= 128 && qk_head_dim <= 128 && short_rows)
    c.knobs["attn_persistent"] = 1;
  return c;
}

namespace {

bool is_attention_kernel(const std::string& name) {
  if (name == "attention_fp8") return true;
  std::lock_guard<std::mutex> lock(variant_defaults_mutex);
  return variant_defaults().count(name) > 0;
}

// What a config-less launch and the tuner's reference take for attention_fp8 and its variants on
// sm_90a: attention_fp8_default_config for the traced dtypes and shapes (q [B,H,Sq,Dqk], k
// [B,Hkv,Skv,Dqk], o [B,H,Sq,D]), as attention_fp8_forward and tilejit run attention pick it.
// Without it they took the generic 64 x 64 tiles.
const bool default_config_registered = [] {
  codegen::register_attention_reference(&attention_fp8, &attention_fp8_merging);
  codegen::register_default_config_provider("attention_fp8", [](const ir::Function& f, const std::string& arch) {
    std::optional<Config> c;
    if (arch != "sm_90a" || f.params.size() < 7 || !is_attention_kernel(f.name)) return c;
    const std::optional<codegen::AttentionMatch> m = codegen::match_attention_fp8(f);
    const ir::Param &q = f.params[0], &k = f.params[1], &o = f.params[6];
    if (!m || q.rank() != 4 || k.rank() != 4 || o.rank() != 4 || q.static_shape[3] <= 0 || o.static_shape[3] <= 0)
      return c;
    const int64_t seq_kv = k.static_shape[2] > 0 ? k.static_shape[2] : 0;
    Config d = attention_variant_default_config(f.name, q.dtype, o.static_shape[3], m->causal || m->mask_mod,
                                                q.static_shape[3], seq_kv, m->with_lse);
    // Only where the tensor-core lowering takes it (head dims, dtypes); the SIMT path keeps the
    // generic tiles.
    try {
      if (codegen::lower_attention_sm90(f, d, codegen::Target::parse("sm_90a"))) c = d;
    } catch (const Error&) {
    }
    return c;
  });
  return true;
}();

}  // namespace

Tile apply_variant_hooks(const AttentionVariant& v, Tile s, const std::function<ScoreIndex()>& make_at, std::optional<Tile>* grad,
                         ScoreModValues* values) {
  if (v.score_mod) {
    TagScope tag("score_mod");
    const ScoreIndex at = make_at();
    const Tile natural = s * kLn2;
    const Tile modded = v.score_mod(natural, at);
    if (!modded.valid() || !is_float(modded.dtype()))
      throw Error(fmt::format("attention variant '{}': score_mod must return a float tile (the new score)", v.name));
    if (grad) {
      if (!v.score_grad) throw Error(fmt::format("attention variant '{}': no score_grad (d score_mod / d score)", v.name));
      const Tile g = v.score_grad(natural, modded, at);
      if (g.valid() && !is_float(g.dtype()))
        throw Error(fmt::format("attention variant '{}': score_grad must return a float tile (d modded / d score) or Tile()", v.name));
      if (g.valid()) *grad = g.to(DType::f32);
    }
    if (values) *values = {natural, modded};
    s = (modded * kLog2e).to(DType::f32);
  }
  if (v.mask_mod) {
    TagScope tag("mask_mod");
    const Tile keep = v.mask_mod(make_at());
    if (!keep.valid() || keep.dtype() != DType::i1)
      throw Error(fmt::format("attention variant '{}': mask_mod must return a boolean tile (a comparison), not {}", v.name,
                              keep.valid() ? std::string(name(keep.dtype())) : "nothing"));
    s = where(keep, s, -INFINITY);
  }
  return s;
}

Kernel attention_variant(const AttentionVariant& variant) {
  if (variant.name.empty()) throw Error("attention_variant: the variant needs a name (it names the kernel)");
  if (variant.key_block < 0)
    throw Error(fmt::format("attention_variant {}: key_block must be 0 (none) or a block size, got {}", variant.name,
                            variant.key_block));
  if (variant.fp8_key_block < 0)
    throw Error(fmt::format("attention_variant {}: fp8_key_block must be 0 (none) or a block size, got {}",
                            variant.name, variant.fp8_key_block));
  {
    std::lock_guard<std::mutex> lock(variant_defaults_mutex);
    const bool score_mod_block = variant.key_block <= 0 && variant.score_mod;
    variant_defaults()[variant.name] = {score_mod_block ? 128 : variant.key_block, variant.fp8_key_block,
                                        variant.fast_math, score_mod_block, variant.uniform_work,
                                        variant.merge_into_output};
  }
  std::vector<Slot> slots;
  const SlotKind kinds[] = {SlotKind::tensor_in,  SlotKind::tensor_in,  SlotKind::tensor_in,  SlotKind::tensor_in,
                            SlotKind::tensor_in,  SlotKind::tensor_in,  SlotKind::tensor_out, SlotKind::tensor_out,
                            SlotKind::scalar_f32, SlotKind::scalar_f32, SlotKind::host_bool,  SlotKind::host_bool};
  for (size_t i = 0; i < kParamNames.size(); ++i) {
    const bool read_too = variant.merge_into_output && kinds[i] == SlotKind::tensor_out;   // o and lse
    slots.push_back(Slot{kParamNames[i], read_too ? SlotKind::tensor_inout : kinds[i]});
  }
  for (const auto& in : variant.inputs) slots.push_back(Slot{in, SlotKind::tensor_in});
  Kernel::Body body = [variant](const detail::TraceArgs& a) {
    using detail::make_arg;
    std::vector<In> inputs;
    for (size_t i = 0; i < variant.inputs.size(); ++i) inputs.push_back(make_arg<In>(a, kParamNames.size() + i));
    attention_body(make_arg<In>(a, 0), make_arg<In>(a, 1), make_arg<In>(a, 2), make_arg<In>(a, 3), make_arg<In>(a, 4),
                   make_arg<In>(a, 5), make_arg<Out>(a, 6), make_arg<Out>(a, 7), make_arg<Scalar>(a, 8),
                   make_arg<Scalar>(a, 9), make_arg<bool>(a, 10), make_arg<bool>(a, 11), &variant, inputs);
  };
  return Kernel(variant.name, std::move(slots), std::move(body), Loc::current());
}

}  // namespace tj::kernels
