// The sm_90a attention lowering (see lower_attention_sm90.h).
#include "codegen/lower_attention_sm90.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/lowering.h"
#include "codegen/attention_hooks.h"
#include "codegen/attention_knobs.h"
#include "codegen/emitter_knobs.h"
#include "dsl/ir.h"
#include "core/error.h"

namespace tj::codegen {

namespace {

// L2 budget (MB) for the K and V of the heads whose causal-like tiles run longest first together
// (knob attn_group_mb; 0: head by head). H100, causal D 128, S 2048-16384: fp8 was
// fastest at 16 (8192: 844 -> 900 TFLOP/s), 16-bit at 8 (8192: 671 -> 697); 32 lost 4% at S 2048
// and one group of every head lost up to 40%.
int default_group_mb(bool fp8) { return fp8 ? 16 : 8; }

// ---- IR identity (names, block names and source locations aside) ------------------------------

bool same_double(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

bool same_region(const ir::Region& a, const ir::Region& b);

bool same_op(const ir::Op& a, const ir::Op& b) {
  if (a.kind != b.kind || a.result != b.result || a.operands != b.operands) return false;
  if (!same_double(a.fval, b.fval) || a.ival != b.ival || a.param != b.param || a.axis != b.axis ||
      a.block_id != b.block_id || a.unary != b.unary || a.binary != b.binary || a.reduce != b.reduce ||
      a.loop_kind != b.loop_kind || a.body_index != b.body_index)
    return false;
  if (a.indices.size() != b.indices.size()) return false;
  for (size_t i = 0; i < a.indices.size(); ++i)
    if (a.indices[i].kind != b.indices[i].kind || a.indices[i].block_id != b.indices[i].block_id) return false;
  if (static_cast<bool>(a.body) != static_cast<bool>(b.body)) return false;
  return !a.body || same_region(*a.body, *b.body);
}

bool same_region(const ir::Region& a, const ir::Region& b) {
  if (a.ops.size() != b.ops.size()) return false;
  for (size_t i = 0; i < a.ops.size(); ++i)
    if (!same_op(a.ops[i], b.ops[i])) return false;
  return true;
}

bool same_function(const ir::Function& a, const ir::Function& b) {
  if (a.params.size() != b.params.size() || a.values.size() != b.values.size() || a.blocks.size() != b.blocks.size())
    return false;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const auto &p = a.params[i], &q = b.params[i];
    if (p.kind != q.kind || p.dtype != q.dtype || p.static_shape != q.static_shape) return false;
  }
  for (size_t i = 0; i < a.values.size(); ++i)
    if (!(a.values[i].type == b.values[i].type) || a.values[i].is_var != b.values[i].is_var) return false;
  for (size_t i = 0; i < a.blocks.size(); ++i)
    if (a.blocks[i].fixed != b.blocks[i].fixed) return false;
  return same_region(a.body, b.body);
}

// The library kernel's parameter layout: q k v q_descale k_descale v_descale (in), o lse (out),
// scale o_scale (f32 scalars).
bool params_fit(const ir::Function& f) {
  using K = ir::ParamKind;
  static const K kinds[] = {K::tensor_in,  K::tensor_in,  K::tensor_in,  K::tensor_in,  K::tensor_in,
                            K::tensor_in,  K::tensor_out, K::tensor_out, K::scalar_f32, K::scalar_f32};
  if (f.params.size() != std::size(kinds)) return false;
  for (size_t i = 0; i < f.params.size(); ++i) {
    const bool read_too = kinds[i] == K::tensor_out && f.params[i].kind == K::tensor_inout;   // merging: o, lse
    if (f.params[i].kind != kinds[i] && !read_too) return false;
  }
  for (int i : {0, 1, 2, 6})
    if (f.params[i].rank() != 4) return false;
  for (int i : {3, 4, 5})
    if (f.params[i].rank() != 2 || f.params[i].dtype != DType::f32) return false;
  return true;
}

struct Reference {
  const Kernel& (*plain)() = nullptr;
  const Kernel& (*merging)() = nullptr;
};
Reference& reference() {
  static Reference r;
  return r;
}

std::optional<AttentionMatch> match_library(const ir::Function& f) {
  const Reference& ref = reference();
  if (!ref.plain || !ref.merging || !params_fit(f)) return std::nullopt;
  std::vector<ArgSpec> specs;
  for (const auto& p : f.params) {
    if (p.is_tensor()) specs.push_back(TensorSpec{p.dtype, p.static_shape});
    else specs.push_back(RuntimeScalar{1.0f});
  }
  specs.push_back(false);   // causal
  specs.push_back(false);   // with_lse
  // A merging kernel reads o and lse: its canonical form is attention_fp8_merging, with an LSE.
  const bool merging = f.params[6].kind == ir::ParamKind::tensor_inout;
  const Kernel& library = merging ? ref.merging() : ref.plain();
  for (int variant = merging ? 2 : 0; variant < 4; ++variant) {
    const bool causal = variant & 1, with_lse = variant & 2;
    specs[specs.size() - 2] = causal;
    specs[specs.size() - 1] = with_lse;
    try {
      ir::Function canonical = library.trace(specs);
      if (same_function(f, canonical)) {
        AttentionMatch m{causal, with_lse};
        m.merging = merging;
        return m;
      }
    } catch (const std::exception&) {
      return std::nullopt;   // the library kernel does not take these types / shapes
    }
  }
  return std::nullopt;
}

// The hooked kernel's skeleton must be the library kernel; returns the hooks too.
std::optional<AttentionMatch> match_uncached(const ir::Function& f, std::optional<AttentionHooks>* hooks_out) {
  auto hooks = split_attention_hooks(f, nullptr);
  std::optional<AttentionMatch> m = match_library(hooks ? hooks->skeleton : f);
  if (!m) return std::nullopt;
  if (hooks) {
    m->score_mod = hooks->score_mod;
    m->mask_mod = hooks->mask_mod;
  }
  if (hooks_out) *hooks_out = std::move(hooks);
  return m;
}

// The skeleton values hook code reads: b and h (the launch nest's floordiv / mod of bh) and the
// starts of the query and key tiles.
HookSymbols hook_symbols(const ir::Function& f) {
  HookSymbols s;
  const ir::Op* grid = nullptr;
  for (const auto& op : f.body.ops)
    if (op.kind == ir::OpKind::loop) grid = &op;
  if (!grid) return s;
  const int bh = grid->body_index;
  const ir::Op* m_loop = nullptr;
  for (const auto& op : grid->body->ops) {
    if (op.kind == ir::OpKind::binary && !op.operands.empty() && op.operands[0] == bh) {
      if (op.binary == ir::BinaryFn::floordiv && s.b < 0) s.b = op.result;
      if (op.binary == ir::BinaryFn::mod && s.h < 0) s.h = op.result;
    }
    if (op.kind == ir::OpKind::loop && !m_loop) m_loop = &op;
  }
  if (!m_loop) return s;
  s.m_start = m_loop->body_index;
  for (const auto& op : m_loop->body->ops)
    if (op.kind == ir::OpKind::loop) s.n_start = op.body_index;
  return s;
}

std::string identifier_of(const std::string& name) {
  std::string out = "tj_attn_";
  for (char c : name) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  return out;
}

const char* wg_type(DType t) {
  switch (t) {
    case DType::e4m3: return "tj::dev::WG_E4M3";
    case DType::bf16: return "tj::dev::WG_BF16";
    default: return "tj::dev::WG_F16";
  }
}
const char* out_type(DType t) {
  switch (t) {
    case DType::bf16: return "tj::dev::ATTN_OUT_BF16";
    case DType::f16: return "tj::dev::ATTN_OUT_F16";
    default: return "tj::dev::ATTN_OUT_E4M3";
  }
}

// Largest key block BN whose S / O / P registers fit a consumer warpgroup's budget (measured
// with ptxas: no spills at these sizes; see bench/attention/build.sh resources.txt).
int max_bn(bool fp8, int64_t D, int consumers) {
  if (consumers == 3) {
    if (D == 64) return 128;
    if (D == 128) return fp8 ? 96 : 64;
    return 0;
  }
  if (fp8) return D == 64 ? 256 : (D == 128 ? 224 : 128);
  return D == 256 ? 64 : 128;
}

std::optional<GeneratedKernel> try_lower(const ir::Function& f, const Config& cfg, const Target& t) {
  if (!t.has_wgmma()) return std::nullopt;
  std::optional<AttentionHooks> hooks;
  auto m = match_uncached(f, &hooks);
  if (!m) return std::nullopt;
  const ir::Param &q = f.params[0], &k = f.params[1], &v = f.params[2], &o = f.params[6];
  const DType in = q.dtype;
  if (in != DType::e4m3 && in != DType::bf16 && in != DType::f16) return std::nullopt;
  if (k.dtype != in || v.dtype != in) return std::nullopt;
  if (o.dtype != DType::bf16 && o.dtype != DType::f16 && o.dtype != DType::e4m3) return std::nullopt;
  const bool fp8 = is_fp8(in);
  const int64_t Dqk = q.static_shape[3];
  const int64_t D = fp8 ? v.static_shape[2] : v.static_shape[3];   // V / O head dim
  auto head_dim_ok = [](int64_t d) { return d == 64 || d == 128 || d == 256; };
  if (!head_dim_ok(Dqk) || !head_dim_ok(D) || k.static_shape[3] != Dqk || o.static_shape[3] != D) return std::nullopt;
  // Static Vt rows that TMA cannot start at 16-byte multiples: leave it to the SIMT path.
  if (fp8 && v.static_shape[3] >= 0 && v.static_shape[3] % 16 != 0) return std::nullopt;

  // ---- config
  const int64_t bm = cfg.block(f, 0), bn = cfg.block(f, 1);
  const int stages = cfg.num_stages;
  const bool overlap = knobs::attn_overlap.of(cfg) != 0;
  const bool wgsync = knobs::attn_wgsync.of(cfg) != 0;
  const bool block_skip = knobs::attn_block_skip.of(cfg) != 0;
  auto fail = [&](const std::string& why) {
    return Error(fmt::format("kernel '{}' with config {} cannot use the sm_90a attention lowering: {}", f.name,
                             cfg.to_json(), why));
  };
  if (bm != 64 && bm != 128 && bm != 192)
    throw fail(fmt::format("block m (the query tile) must be 64, 128 or 192 (1-3 consumer warpgroups), not {} "
                           "(config knob lowering = 0 selects the SIMT path)",
                           bm));
  const int consumers = static_cast<int>(bm / 64);
  // fp8: P's A fragment wants other keys per thread than S's accumulator holds. By default K's
  // stages hold each block's even keys, then its odd keys (a TMA map stepping 2 keys;
  // hopper_attention.cuh's kKeysByParity), and S's columns come out in the order P needs for the
  // natural V (H200, against the V permutation below: +4-9% at every fp8 tile). Knob
  // attn_keys_by_parity = 0 (or attn_vperm = 1) instead has the producer's spare warps permute each
  // V stage (attn_vperm, default with 2+ consumers; with one, the permutation cost about what it
  // saved: H100, m128 n192 +1-3%, m64 n192 -3%) or converts P with shuffles (16-bit:
  // neither applies).
  // The exception: a linear score hook (ALiBi) with three consumers keeps the V permutation (H200,
  // ALiBi causal S 8192, 192 x 96: 785 / 787 TFLOP/s permuted, 750 / 750 by parity,
  // the same main loop in SASS; at 64 x 128, S 2048, parity +2%).
  const bool vperm_asked = knobs::attn_vperm.of(cfg) != 0;
  const bool linear_hook_3 = consumers == 3 && hooks && hooks->score_mod && knobs::attn_linear_score.of(cfg) != 0 &&
                             score_hook_is_linear(f, *hooks, hook_symbols(f));
  const bool keys_by_parity = fp8 && knobs::attn_keys_by_parity.of(cfg, vperm_asked || linear_hook_3 ? 0 : 1) != 0;
  if (keys_by_parity && vperm_asked)
    throw fail("knobs attn_keys_by_parity = 1 and attn_vperm = 1 both reorder P's keys: choose one");
  const bool vperm = !keys_by_parity && knobs::attn_vperm.of(cfg, consumers >= 2 ? 1 : 0) != 0;
  // Of every 8 score exp2s, how many run on the FMA pipes (exp2_fma.cuh) instead of the MUFU.
  const int64_t exp2_fma = knobs::attn_exp2_fma.of(cfg);
  // Where P goes to e4m3 straight (fp8, keys by parity, no LSE) those exp2s run in pairs in f16x2
  // (exp2_f16x2: about 5 instructions a score, exp2_fma 9); knob attn_exp2_f16 = 0 keeps exp2_fma.
  // (A merging kernel's LSE takes the e4m3 P's sums too: AttentionMatch::merging; so does one with
  // knob attn_lse_e4m3_sums = 1, the first part of a merged result such as dilated attention's.)
  const bool f32_row_sums = m->with_lse && !m->merging && knobs::attn_lse_e4m3_sums.of(cfg) == 0;   // kF32RowSums
  const bool exp2_f16 = knobs::attn_exp2_f16.of(cfg) != 0 && exp2_fma > 0 && keys_by_parity && !f32_row_sums;
  if (exp2_fma < 0 || exp2_fma > 8)
    throw fail(fmt::format("knob attn_exp2_fma counts the score exp2s of every 8 computed on the FMA pipes: 0 to 8, "
                           "not {}",
                           exp2_fma));
  // The warp skips O's rescale where all its alphas are 1 (a vote per block), with a score hook too:
  // lazy rescaling leaves most alphas at 1 (H100, vote vs none, S 2048 / 8192: bf16 ALiBi +1-3%,
  // softcap +2%, fp8 within 1%; without lazy rescaling the vote had cost ALiBi 1-4%). Knob
  // attn_rescale_vote = 0 rescales at every block.
  const bool rescale_vote = knobs::attn_rescale_vote.of(cfg) != 0;
  const int limit = max_bn(fp8, D, consumers);
  const int64_t bn_mult = fp8 ? 32 : 16;
  const bool bn_listed = bn == 64 || bn == 96 || bn == 128 || bn == 192 || bn == 224 || bn == 256;
  if (bn % bn_mult != 0 || bn < 64 || bn > limit || !bn_listed)
    throw fail(fmt::format("block n (the key block) must be a multiple of {} in [64, {}] among 64, 96, 128, 192, 224, "
                           "256 for head dim {} with {} consumer warpgroup(s), not {}",
                           bn_mult, limit, D, consumers, bn));
  if (stages < 1 || stages > 4) throw fail(fmt::format("num_stages must be in [1, 4], not {}", stages));
  if (wgsync && consumers < 2)
    throw fail("knob attn_wgsync = 1 needs block m = 128 or 192 (two or three consumer warpgroups take turns)");
  const int es = fp8 ? 1 : 2;
  const int64_t dbytes = Dqk * es;   // a Q / K row
  // A producer warp instead of a producer warpgroup (hopper_attention.cuh's kLeanProducer): with one
  // consumer and room for three CTAs' shared memory, three CTAs share an SM.
  // No producer warp either (hopper_attention.cuh's kSelfLoad): the consumer warpgroup issues its own
  // K / V loads; 128 threads a CTA, three CTAs an SM where their shared memory fits.
  const bool self_load = knobs::attn_self_load.of(cfg) != 0;
  const bool lean = knobs::attn_lean_producer.of(cfg) != 0 || self_load;
  // as hopper_attention.cuh's Cfg::kSmemBytes: alignment slack, Q, stages, the row sums' tile of ones (fp8 without an
  // LSE: kRowSumMma), barriers, block table, bits, list (Cfg::kBlockTable: all but self-loading kernels without a
  // mask hook), the running LSE (merging)
  const bool rowsum_mma = fp8 && !f32_row_sums && !(lean && consumers > 1);   // hopper_attention.cuh's kRowSumMma
  const bool block_table = !self_load || m->mask_mod;
  const int64_t table_entries = self_load ? 128 : 512;   // Cfg::kClassTable
  const int64_t smem = 1024 + bm * dbytes + stages * bn * (dbytes + D * es) + (rowsum_mma ? 256 : 0) +
                       (1 + 5 * stages) * 8 + (block_table ? 3 * table_entries + table_entries / 8 : 0) +
                       (m->merging ? 4 * bm : 0);
  // Persistent (knob attn_persistent, below): O's staging rows too (Cfg::kOStageBytes: 16 of
  // alignment, a row of O and 16 bytes a query)
  const bool persistent = knobs::attn_persistent.of(cfg) != 0;
  const int64_t o_stage = persistent ? 16 + bm * (D * (o.dtype == DType::e4m3 ? 1 : 2) + 16) : 0;
  if (smem + o_stage > t.max_smem_per_block())
    throw fail(fmt::format("{} bytes of shared memory (Q tile + {} stages of K and V{}) exceed the {} a block can use",
                           smem + o_stage, stages, persistent ? " + O's staging rows" : "", t.max_smem_per_block()));
  if (lean && fp8 && vperm && cfg.knobs.count("attn_vperm"))
    throw fail("knob attn_lean_producer = 1 has no warps to permute V with (attn_vperm = 1)");
  const int threads = self_load ? 128 : lean ? 128 * consumers + 32 : 128 * (1 + consumers);
  const int wq = static_cast<int>(dbytes >= 128 ? 128 : dbytes);
  const int wv = fp8 ? ((bn % 128 == 0) ? 128 : (bn % 64 == 0) ? 64 : 32) : 128;   // Cfg::kWv

  // ---- hooks
  // A mask hook that keeps kv <= q, alone or and-ed with the rest of the mask (documents, windows,
  // block masks: causal_conjunct), has the kernel's own causal mask in it: that part is masked and
  // skipped as the built-in one does (the last key block from the tile's rows, the diagonal per
  // consumer, a comparison per element) and only the rest stays a hook, per element where a block
  // is partly visible to it. Exactly kv <= q needs no hook and no block table (H100:
  // the causal variant fp8 S 8192 through its hook 755-767 TFLOP/s, the built-in causal mask
  // 830-838). Not with block skipping off: that must visit every block. Knob attn_causal_hook = 1
  // keeps the hook whole: the default for 16-bit inputs with a score hook too (H100, bf16
  // ALiBi S 2048 / 8192: 398-409 / 508-509 TFLOP/s built in, 411-413 / 534 as a hook; fp8 ALiBi
  // 527-536 / 618-620 built in, 492-495 / 592-593 as a hook).
  const int64_t causal_hook_default = !fp8 && hooks && hooks->score_mod ? 1 : 0;
  const int causal_leaf = hooks && block_skip && knobs::attn_causal_hook.of(cfg, causal_hook_default) == 0
                              ? causal_conjunct(*hooks, hook_symbols(f))
                              : -1;
  const bool causal_from_hook = causal_leaf >= 0;
  const bool causal_only = causal_from_hook && hooks->keep == causal_leaf;
  if (causal_from_hook) {
    m->causal = true;
    hooks->assumed_true = causal_leaf;
  }
  if (causal_only) {
    m->mask_mod = false;
    hooks->mask_mod = false;
    hooks->keep = -1;
    if (!hooks->score_mod) hooks.reset();
  }
  // A mask hook that keeps exactly kv <= q || kv < E, E the same over a CTA (prefix-LM), is the
  // built-in causal mask with every row's bound raised to E - 1 (the hooks' causal_prefix()): no
  // block table, no list walk, no per-element hook on the diagonal blocks. Not with block skipping
  // off; knob attn_causal_hook = 1 keeps the hook.
  const int prefix_leaf = hooks && !causal_from_hook && !m->causal && block_skip &&
                                  knobs::attn_causal_hook.of(cfg, causal_hook_default) == 0
                              ? causal_prefix(f, *hooks, hook_symbols(f))
                              : -1;
  if (prefix_leaf >= 0) {
    m->causal = true;
    m->mask_mod = false;
    hooks->mask_mod = false;
    hooks->keep = -1;
    hooks->causal_prefix = prefix_leaf;
  }
  std::optional<HooksSource> hooks_src;
  if (hooks) {
    std::string why;
    // A linear score hook (ALiBi) as a term per key column and one per row; knob
    // attn_linear_score = 0 evaluates score() per element instead. Knob fast_math as everywhere.
    HookOptions ho;
    ho.skip_blocks = block_skip;
    ho.linear_score = knobs::attn_linear_score.of(cfg) != 0;
    ho.fast_math = knobs::fast_math.of(cfg) != 0;
    hooks_src = hooks_source(f, *hooks, hook_symbols(f), "tj_hooks", "tj_hk", ho, &why);
    if (!hooks_src) return std::nullopt;   // e.g. a hook that loads a tile: the SIMT path runs it
  }
  // Persistent (hopper_attention.cuh's AttnPersistentTiles): as many CTAs as fit the GPU at once,
  // each looping over query tiles in the natural order; a CTA loads its next tile's Q and first
  // key blocks while it finishes the last one and starts once. O goes out through staging rows of
  // its own in shared memory (the rest holds the next tile's loads by then).
  if (persistent && hooks_src)
    throw fail("knob attn_persistent = 1 takes a kernel without mask or score hooks (the hooks are set up per "
               "tile of the launch)");
  if (self_load && (consumers != 1 || overlap || persistent || stages < 2))
    throw fail("knob attn_self_load = 1 takes block m = 64, attn_overlap = 0, one tile a CTA (attn_persistent = 0) and "
               "num_stages >= 2 (a block's V loads while the block before it runs its P.V)");

  // ---- source
  const std::string entry = identifier_of(f.name);
  std::string src;
  src += fmt::format("// tilejit: kernel '{}' for {}, generated by the sm_90a attention lowering "
                     "(codegen/lower_attention_sm90.cpp).\n",
                     f.name, t.arch);
  src += fmt::format("// config: {}\n", cfg.to_json());
  src += fmt::format("// Recognized as kernels/attention_fp8.cpp (causal: {}, with_lse: {}{}{}): {} inputs, {} output, "
                     "head dims {} (q, k) and {} (v, o).\n",
                     causal_only ? "yes, the mask hook's kv <= q as the built-in causal mask"
                     : prefix_leaf >= 0 ? "yes, the mask hook's kv <= q || kv < prefix as the built-in causal mask with the hooks' causal_prefix()"
                     : causal_from_hook ? "yes, the mask hook's kv <= q as the built-in causal mask, the rest of it a hook"
                     : m->causal ? "yes" : "no",
                     m->merging ? "yes, merged into o and lse" : m->with_lse ? "yes" : "no",
                     m->score_mod ? ", score_mod hook" : "",
                     m->mask_mod ? (block_skip ? ", mask_mod hook with block skipping" : ", mask_mod hook") : "",
                     name(in), name(o.dtype), Dqk, D);
  src += fmt::format("// Per CTA: a {} x {} query tile (one program of the launch nest [B*H][ceil(Sq/{})]{}), key blocks of "
                     "{}, {} K/V stages;\n// warpgroups: one TMA producer{}, {} wgmma consumer(s) of 64 rows{}{}. "
                     "The main loop is codegen/device/hopper_attention.cuh.\n",
                     bm, D, bm, persistent ? "; persistent: each CTA takes one after another" : "", bn, stages,
                     fp8 && vperm && !lean ? " (its other warps permute V's keys for a shuffle-free P)"
                     : keys_by_parity      ? " (K's even keys, then its odd keys, for a shuffle-free P)"
                                           : "",
                     consumers, overlap ? ", softmax overlapped with P.V" : "", wgsync ? ", inter-warpgroup schedule" : "");
  src += "#include \"tile.cuh\"\n#include \"hopper_attention.cuh\"\n#include \"attn_tile_order.cuh\"\n";
  if (bn == 224) src += "TJ_WGMMA_DEFINE(224)   // S = Q.K^T; hopper_wgmma.cuh predefines the other widths\n";
  if (hooks_src) src += "#include \"interval.cuh\"\n";
  src += "\n";
  src += fmt::format("using tj_cfg = tj::dev::AttnCfg<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>;\n\n", Dqk,
                     bn, stages, consumers, wg_type(in), out_type(o.dtype), m->causal ? "true" : "false",
                     overlap ? "true" : "false", wgsync ? "true" : "false", fp8 && vperm && !lean ? "true" : "false", D,
                     exp2_fma, rescale_vote ? "true" : "false", lean ? "true" : "false",
                     keys_by_parity ? "true" : "false", f32_row_sums ? "true" : "false", exp2_f16 ? "true" : "false",
                     m->merging ? "true" : "false", m->with_lse ? "true" : "false", self_load ? "true" : "false",
                     block_table ? "true" : "false");
  // The launch's dynamic shared memory comes from the formula above; the kernel lays it out by
  // its Cfg. NVRTC checks that the two agree.
  src += fmt::format("static_assert(tj_cfg::kSmemBytes{} == {}, \"lower_attention_sm90.cpp's shared-memory size must "
                     "match hopper_attention.cuh's Cfg::kSmemBytes{}\");\n\n",
                     persistent ? " + tj_cfg::kOStageBytes" : "", smem + o_stage, persistent ? " + kOStageBytes" : "");
  if (hooks_src) src += "// The variant's hooks (codegen/attention_hooks.cpp), from the ops tagged in its trace.\n" + hooks_src->decl + "\n";
  std::vector<std::string> params;
  for (size_t i = 0; i < f.params.size(); ++i) {
    const ir::Param& p = f.params[i];
    if (p.is_tensor()) params.push_back(fmt::format("tj::dev::TensorArg<{}> p{} /* {} */", p.rank(), i, p.name));
    else params.push_back(fmt::format("float p{} /* {} */", i, p.name));
  }
  params.push_back("const __grid_constant__ tj::dev::TmaDescriptor tj_tma_q");
  params.push_back("const __grid_constant__ tj::dev::TmaDescriptor tj_tma_k");
  params.push_back("const __grid_constant__ tj::dev::TmaDescriptor tj_tma_v");
  if (persistent) params.push_back("long long tj_programs");
  // One consumer warpgroup and room for two CTAs' shared memory (228 KB per SM): two CTAs per SM
  // (128 registers per thread at launch; the warpgroups rebalance them), so one CTA's start and
  // end overlap the other's main loop.
  // Three with a producer warp (160 threads, 128 registers each) where the shared memory fits and
  // the consumer's accumulators (S: BN / 2 registers, O: D / 2) leave room in 128 registers.
  // Without a producer warp (128 threads), three CTAs' 12 warps take up to 168 registers each, four
  // CTAs' 16 warps 128, where S and O's accumulators leave room in them (BN / 2 + D / 2 up to 128
  // and 96: fp8 64 x 128 and 64 x 64 at head dim 128). An fp8 kernel with
  // the tensor cores' row sums and an LSE holds its row maxima in 1 KB of static shared memory too
  // (Cfg::kRowMaxInSmem).
  const int64_t static_smem = rowsum_mma && m->with_lse ? 1024 : 0;
  auto fit = [&](int ctas) { return ctas * (smem + static_smem + o_stage + 1024) <= 233472; };
  const int ctas_per_sm = consumers != 1 ? 1
                          : self_load && fit(4) && bn / 2 + D / 2 <= 96 ? 4
                          : self_load && fit(3) && bn / 2 + D / 2 <= 128 ? 3
                          : lean && 3 * (smem + o_stage + 1024) <= 233472 && bn / 2 + D / 2 <= 96 ? 3
                          : 2 * (smem + o_stage + 1024) <= 233472 ? 2 : 1;
  src += fmt::format("extern \"C\" __global__ void __launch_bounds__({}, {}) {}({}) {{\n", threads, ctas_per_sm, entry,
                     fmt::join(params, ",\n    "));
  auto line = [&](const std::string& s) { src += "  " + s + "\n"; };
  line(fmt::format("const long long tj_m_tiles = (p0.shape[2] + {}) / {};", bm - 1, bm));
  if (!persistent) {
    line("const long long tj_programs = p0.shape[0] * p0.shape[1] * tj_m_tiles;");
    line("const long long tj_pid = (long long)blockIdx.x + (long long)blockIdx.y * gridDim.x;");
    line("if (tj_pid >= tj_programs) return;");
  }
  line("tj::dev::AttnParams tj_p;");
  line("tj_p.B = (int)p0.shape[0];");
  line("tj_p.H = (int)p0.shape[1];");
  line("tj_p.Sq = (int)p0.shape[2];");
  line("tj_p.Hkv = (int)p1.shape[1];");
  line("tj_p.Skv = (int)p1.shape[2];");
  line("tj_p.O = p6.data;");
  line("tj_p.o_sb = p6.stride[0]; tj_p.o_sh = p6.stride[1]; tj_p.o_ss = p6.stride[2]; tj_p.o_sd = p6.stride[3];");
  if (m->with_lse) {
    line("tj_p.lse = (float*)p7.data;");
    line("tj_p.lse_sb = p7.stride[0]; tj_p.lse_sh = p7.stride[1]; tj_p.lse_ss = p7.stride[2];");
  } else {
    line("tj_p.lse = nullptr;   // with_lse = false");
    line("tj_p.lse_sb = tj_p.lse_sh = tj_p.lse_ss = 0;");
  }
  line("tj_p.q_descale = (const float*)p3.data; tj_p.qd_sb = p3.stride[0]; tj_p.qd_sh = p3.stride[1];");
  line("tj_p.k_descale = (const float*)p4.data; tj_p.kd_sb = p4.stride[0]; tj_p.kd_sh = p4.stride[1];");
  line("tj_p.v_descale = (const float*)p5.data; tj_p.vd_sb = p5.stride[0]; tj_p.vd_sh = p5.stride[1];");
  line("tj_p.score_scale = p8;");
  line("tj_p.o_scale = p9;");
  line("tj_p.o_amax = nullptr;");
  // Causal-like masks give later query tiles more keys: those start first, across a group of
  // heads whose K and V fit attn_group_mb MB of L2 (0: head by head), so that short tiles fill
  // the grid's tail (attn_tile_order.cuh). Knob attn_reverse_tiles = 0 keeps the natural order.
  const bool longest_first = m->causal || (m->mask_mod && knobs::attn_reverse_tiles.of(cfg) != 0);
  if (persistent) {
    line("// persistent: tiles blockIdx.x, blockIdx.x + gridDim.x, ... of tj_programs in the natural order");
    line("tj::dev::attn_fwd_persistent<tj_cfg>(&tj_tma_q, &tj_tma_k, &tj_tma_v, tj_p, (unsigned)tj_programs, "
         "(unsigned)tj_m_tiles);");
  } else {
    if (longest_first) {
      const int64_t budget_mb = knobs::attn_group_mb.of(cfg, default_group_mb(fp8));
      if (budget_mb < 0 || budget_mb > 4096)
        throw fail(fmt::format("knob attn_group_mb is an L2 budget in MB, 0 (head by head) to 4096, got {}", budget_mb));
      const int64_t kv_row_bytes = (Dqk + D) * es;   // a key's K and V
      line(budget_mb > 0
               ? fmt::format("const unsigned tj_group = tj::dev::attn_tile_group({}u, (unsigned)((p1.shape[2] * {} + 1023) >> 10), "
                             "(unsigned)p0.shape[1] / (unsigned)p1.shape[1]);   // heads whose K and V fit {} MB",
                             budget_mb << 10, kv_row_bytes, budget_mb)
               : std::string("const unsigned tj_group = 1u;   // head by head (attn_group_mb = 0)"));
      line("const tj::dev::AttnTile tj_tile = tj::dev::attn_tile_longest_first((unsigned)tj_pid, (unsigned)tj_m_tiles, "
           "(unsigned)(p0.shape[0] * p0.shape[1]), tj_group);");
    } else {
      line("const tj::dev::AttnTile tj_tile = tj::dev::attn_tile_natural((unsigned)tj_pid, (unsigned)tj_m_tiles);");
    }
    line("const int tj_bh = tj_tile.bh, tj_mt = tj_tile.m_tile;");
    if (hooks_src) {
      line("const long long tj_b = (unsigned)tj_bh / (unsigned)p0.shape[1], tj_h = (unsigned)tj_bh % (unsigned)p0.shape[1];");
      std::string init = hooks_src->init;
      for (size_t pos = 0, next; pos < init.size(); pos = next + 1) {
        next = init.find('\n', pos);
        if (next == std::string::npos) next = init.size();
        if (next > pos) line(init.substr(pos, next - pos));
      }
      line("tj::dev::attn_fwd_device<tj_cfg, tj_hooks>(&tj_tma_q, &tj_tma_k, &tj_tma_v, tj_p, tj_bh, tj_mt, tj_hk);");
    } else {
      line("tj::dev::attn_fwd_device<tj_cfg>(&tj_tma_q, &tj_tma_k, &tj_tma_v, tj_p, tj_bh, tj_mt);");
    }
  }
  src += "}\n";

  GeneratedKernel g;
  g.name = f.name;
  g.entry = entry;
  g.source = std::move(src);
  g.threads = threads;
  g.dynamic_smem_bytes = static_cast<size_t>(smem + o_stage);
  g.starts_early = true;   // it waits (griddep_wait) before it touches O or the LSE
  g.persistent = persistent;
  g.blocks_per_sm = persistent ? ctas_per_sm : 1;
  g.device_headers = {"tile.cuh", "fp8.cuh", "hopper_wgmma.cuh", "hopper.cuh", "exp2_fma.cuh", "hopper_attention.cuh", "attn_tile_order.cuh"};
  if (hooks_src) g.device_headers.push_back("interval.cuh");
  const int ib = static_cast<int>(bm), nb = static_cast<int>(bn), d = static_cast<int>(D);
  // 4-D maps, batch and head kept apart (hopper_attention.cuh): any strides TMA takes work.
  g.tma.push_back(TmaOperand{0, {1, 1, ib, wq / es}, wq, {}});
  g.tma.push_back(TmaOperand{1, {1, 1, nb, wq / es}, wq, {}});
  if (keys_by_parity) g.tma.back().element_strides = {1, 1, 2, 1};   // half a block per load: even or odd keys
  if (fp8) g.tma.push_back(TmaOperand{2, {1, 1, d, wv}, wv, {}});
  else g.tma.push_back(TmaOperand{2, {1, 1, nb, 64}, 128, {}});
  return g;
}

const bool registered = [] {
  register_lowering(PatternLowering{"sm90_attention", &try_lower});
  codegen::register_knob_provider("sm90_attention", [](const ir::Function& f, const std::string& arch) {
    std::vector<codegen::Knob> knobs;
    std::optional<AttentionHooks> hooks;
    const std::optional<AttentionMatch> m = arch == "sm_90a" ? match_uncached(f, &hooks) : std::nullopt;
    if (!m) return knobs;
    const bool fp8 = is_fp8(f.params[0].dtype);
    knobs.push_back({"attn_overlap", {1, 0}, 1});
    knobs.push_back({"attn_wgsync", {0, 1}, 0});
    if (fp8) knobs.push_back({"attn_keys_by_parity", {1, 0}, 1});   // ALiBi on 192 rows defaults to 0 (above)
    if (fp8) knobs.push_back({"attn_vperm", {0, 1}, 0});   // with attn_keys_by_parity = 0 only
    knobs.push_back({"attn_lean_producer", {0, 1}, 0});
    if (!hooks) knobs.push_back({"attn_persistent", {0, 1}, 0});   // the default for short plain 16-bit rows (kernels/attention_fp8.cpp)
    knobs.push_back({"attn_self_load", {0, 1}, 0});   // fp8's default for short dense rows (64 x 128, no overlap)
    // exp2s off the MUFU: f16x2 pairs where P goes to e4m3 straight (no LSE), else exp2_fma (f32)
    if (fp8 && (!m->with_lse || m->merging)) knobs.push_back({"attn_exp2_fma", {0, 2, 3, 4}, 0});
    if (hooks && hooks->score_mod) knobs.push_back({"attn_rescale_vote", {1, 0}, 1});
    if (hooks && hooks->score_mod && score_hook_is_linear(f, *hooks, hook_symbols(f)))
      knobs.push_back({"attn_linear_score", {1, 0}, 1});
    const bool causal_part = hooks && (causal_conjunct(*hooks, hook_symbols(f)) >= 0 ||
                                       (!m->causal && causal_prefix(f, *hooks, hook_symbols(f)) >= 0));
    if (causal_part) knobs.push_back({"attn_causal_hook", {0, 1}, !fp8 && hooks->score_mod ? 1 : 0});
    // The tile order of a mask without the built-in causal part: longest first (for causal-like masks)
    // or natural (masks that give every query tile as many keys: AttentionVariant::uniform_work).
    if (hooks && hooks->mask_mod && !m->causal && !causal_part) knobs.push_back({"attn_reverse_tiles", {1, 0}, 1});
    if (m->causal || m->mask_mod) {
      const int group_mb = default_group_mb(fp8);
      knobs.push_back({"attn_group_mb", {group_mb, group_mb == 8 ? 16 : 8, 0}, group_mb});
    }
    return knobs;
  });
  return true;
}();

}  // namespace

void register_attention_reference(const Kernel& (*plain)(), const Kernel& (*merging)()) {
  reference() = Reference{plain, merging};
}

std::optional<AttentionMatch> match_attention_fp8(const ir::Function& f) {
  // Four traces of the library kernel (~1 ms) per call; only kernels with the library kernel's
  // parameter layout get this far.
  return match_uncached(f, nullptr);
}

std::optional<GeneratedKernel> lower_attention_sm90(const ir::Function& f, const Config& cfg, const Target& t) {
  return try_lower(f, cfg, t);
}

}  // namespace tj::codegen
