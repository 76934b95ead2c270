#include "kernels/dilated_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "kernels/attention_variants.h"
#include "kernels/library.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"

namespace tj::kernels {

namespace {

// Every `step`-th index of dimension `dim` from `first` on.
TensorView every(const TensorView& t, int dim, int64_t first, int64_t step) { return every_of(t, dim, first, step); }

// Index i of dimension `dim`, the dim dropped.
TensorView at(const TensorView& t, int dim, int64_t i) {
  TensorView s = t;
  s.strides = t.effective_strides();
  s.data = static_cast<char*>(t.data) + i * s.strides[dim] * size_bytes(t.dtype);
  s.shape.erase(s.shape.begin() + dim);
  s.strides.erase(s.strides.begin() + dim);
  return s;
}

// Entry p of a stacked tensor [P, ...].
TensorView entry(const TensorView& t, int64_t p) { return at(t, 0, p); }

// Indices [first, first + count) of dimension `dim`.
TensorView slice(const TensorView& t, int dim, int64_t first, int64_t count) { return slice_of(t, dim, first, count); }

// [B, H, ...] of a contiguous tensor as [B·H, ...].
TensorView batch_and_heads_as_one(const TensorView& t) {
  TensorView s = t;
  s.strides = t.effective_strides();
  s.shape.erase(s.shape.begin());
  s.strides.erase(s.strides.begin());
  s.shape[0] *= t.shape[0];
  return s;
}

// A pair of rate 1 whose rows are several whole segments (of a multiple of 16 positions): plain
// attention runs them as heads (plan_pair), and FP8 stores its Vᵀ segment by segment for it.
bool segments_as_heads_fit(const DilatedPair& pair, int64_t S) {
  return pair.rate == 1 && S > pair.segment && S % pair.segment == 0 && pair.segment % 16 == 0;
}

// lse = -inf (no keys yet) and o = 0: the start of a running result that merging variants merge
// into, where no pair writes one (none has rate 1).
const Kernel& dilated_start() {
  static const Kernel k = kernel("dilated_start", {"o", "lse"}, [](Out o, Out lse) {
    auto [B, H, S, D] = o.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H);
      auto h = bh % H;
      for (auto s : tile(S, block("s"))) {
        o.store(b, h, s, all, zeros({s, D}, o.dtype()));
        lse.store(b, h, s, full({s}, -INFINITY, DType::f32));
      }
    }
  });
  return k;
}

// Columns [first, first + count) of the last dim.
TensorView columns(const TensorView& t, int64_t first, int64_t count) {
  return slice(t, static_cast<int>(t.shape.size()) - 1, first, count);
}

// The checks every path shares.
void check_pairs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                 const std::vector<DilatedPair>& pairs, const char* who) {
  const int64_t P = static_cast<int64_t>(pairs.size());
  if (P == 0) throw Error(fmt::format("{}: no (segment, rate) pairs", who));
  if (q.rank() != 4 || k.shape != q.shape || v.shape != q.shape || o.shape != q.shape)
    throw Error(fmt::format("{}: q, k, v and o must all be [B, H, S, D]; got q {} k {} v {} o {}", who, q.describe(),
                            k.describe(), v.describe(), o.describe()));
  const int64_t H = q.shape[1];
  for (const auto& [w, r] : pairs)
    if (w < 1 || r < 1 || w % r != 0 || H % r != 0)
      throw Error(fmt::format("{}: pair (segment {}, rate {}): the rate must divide the segment length and the number of "
                              "heads ({})",
                              who, w, r, H));
}

void ensure_lse(DilatedWorkspace& ws, const TensorView& q) {
  const std::vector<int64_t> shape = {q.shape[0], q.shape[1], q.shape[2]};
  if (!ws.lse || ws.lse->shape() != shape) ws.lse.emplace(DType::f32, shape);
}

// The attention of one pair: segments of w / r positions of each offset's strided view, merged
// into o and the running LSE, or (`merging` false: the first pair, of rate 1) written to them.
// One kernel per segment length, causality and kind for the process: the launches' caches know a
// kernel by its address, and a new one per call would be traced again at every launch.
const Kernel& pair_kernel(const DilatedPair& pair, bool causal, bool merging) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, bool, bool>, Kernel> kernels;
  std::lock_guard<std::mutex> lock(mutex);
  const int64_t segment = pair.segment / pair.rate;
  auto it = kernels.find({segment, causal, merging});
  if (it == kernels.end()) {
    AttentionVariant v = segment_variant(segment, causal);
    if (merging) {
      v.name += "_merging";
      v.merge_into_output = true;
    }
    it = kernels.emplace(std::make_tuple(segment, causal, merging), attention_variant(v)).first;
  }
  return it->second;
}

// The order the pairs run in: one of rate 1 first, if any, the others as given. A pair of rate 1
// sees every row, so it writes o and the LSE and the others merge into them; without one,
// dilated_start empties them first (start_empty) and every pair merges.
struct PairOrder {
  std::vector<size_t> order;
  bool first_writes = false;   // order[0] has rate 1 and writes
  bool merges(size_t p) const { return !first_writes || p != order.front(); }
};
PairOrder pair_order(const std::vector<DilatedPair>& pairs) {
  PairOrder po;
  for (size_t p = 0; p < pairs.size(); ++p) po.order.push_back(p);
  auto rate1 = std::find_if(pairs.begin(), pairs.end(), [](const DilatedPair& p) { return p.rate == 1; });
  if (rate1 != pairs.end()) {
    std::rotate(po.order.begin(), po.order.begin() + (rate1 - pairs.begin()), po.order.begin() + (rate1 - pairs.begin()) + 1);
    po.first_writes = true;
  }
  return po;
}

// The config of a pair's launches in fp8: `given` or the default for its rows (`masked`: with a
// mask, the segments' or a causal one); the pair that writes takes its LSE from the e4m3 P's sums
// as the merging ones do (knob attn_lse_e4m3_sums), so that every pair weighs its keys as its O does.
Config fp8_pair_config(const std::optional<Config>& given, const Kernel& kernel, int64_t D, int64_t keys, bool merging,
                       bool masked) {
  Config c = given ? *given : attention_variant_default_config(kernel.name(), DType::e4m3, D, masked, D, keys, false);
  if (!merging) c.knobs["attn_lse_e4m3_sums"] = 1;
  return c;
}

// dilated_start: rows no pair covers stay 0, and each row a pair covers gets the first merge's
// weight 0 on o.
void start_empty(const TensorView& o, DilatedWorkspace& ws, CUstream stream) {
  LaunchOptions lo;
  lo.stream = stream;
  lo.config = Config();
  lo.config->blocks = {{"s", 64}};
  launch(dilated_start(), {o, ws.lse->view()}, lo);
}

// Heads j, j + r, ... and rows j, j + r, ... of [B, H, S, ...].
TensorView sparse(const TensorView& t, int64_t j, int64_t r) { return every(every(t, 1, j, r), 2, j, r); }

}  // namespace

std::optional<TensorView> dilated_segments_as_heads(const TensorView& offset_view, int rows_dim, int64_t count) {
  TensorView t = offset_view;
  t.strides = t.effective_strides();
  if (t.rank() < 2 || count < 1 || (rows_dim != -1 && (rows_dim < 2 || rows_dim >= t.rank()))) return std::nullopt;
  const int64_t B = t.shape[0], heads = t.shape[1];
  if (B > 1 && t.strides[0] != heads * t.strides[1]) return std::nullopt;
  int64_t segment_stride = 0;   // no rows: every segment reads the same (b, h) entry
  if (rows_dim >= 0) {
    const int64_t rows = t.shape[rows_dim];
    if (rows % count != 0) return std::nullopt;
    t.shape[rows_dim] = rows / count;
    segment_stride = rows / count * t.strides[rows_dim];
  }
  TensorView s = t;
  s.shape = {B * heads, count};
  s.strides = {t.strides[1], segment_stride};
  s.shape.insert(s.shape.end(), t.shape.begin() + 2, t.shape.end());
  s.strides.insert(s.strides.end(), t.strides.begin() + 2, t.strides.end());
  return s;
}

namespace {

// One launch per offset: the views of offset j (`views_of(j)`) each.
std::vector<std::vector<TensorView>> offset_launches(int64_t r, const std::function<std::vector<TensorView>(int64_t)>& views_of) {
  std::vector<std::vector<TensorView>> launches;
  for (int64_t j = 0; j < r; ++j) launches.push_back(views_of(j));
  return launches;
}

// An argument of a pair's attention for one offset, and the dim of its rows (-1: none, a descale
// per (b, h); kSegmentsAsHeads: laid out as dilated_segments_as_heads would view it).
constexpr int kSegmentsAsHeads = -2;
struct Operand {
  TensorView view;
  int rows_dim;
};

// How one pair's attention runs: the kernel and each launch's arguments.
struct PairPlan {
  const Kernel* kernel = nullptr;
  bool causal_flag = false;   // the kernel's causal argument: plain attention of a causal pair
  bool masked = false;        // a mask (the segments' or causal) for the default configs
  int64_t keys = 0;           // keys of a row (at most), for the default configs
  std::vector<std::vector<TensorView>> launches;
};

// Where each offset's rows are whole segments, plain attention runs without the segment mask (its
// block walk costs 3-4%: H200, S 2048, attention_fp8 vs the segment variant, fp8 0.331
// vs 0.342 ms, bf16 0.428 vs 0.448): on each offset's view where its rows are one segment, on the
// segments as heads (dilated_segments_as_heads; FP8's Vᵀ stored so by dilated_quantize) where a
// pair of rate 1 has several (segments_as_heads_fit). Otherwise the segment variant's mask cuts
// them. (The tensor maps read (b, h) as one dim over B·H heads, and an offset's segments as heads
// do not lie so for rates above 1; 4-D maps read at (h, b) took them, and the offsets of a pair as
// heads of one launch, but changed ptxas's schedule of the causal fp8 kernels' main loop: 4-5%
// slower on an H100.)
PairPlan plan_pair(const DilatedPair& pair, int64_t S, bool causal, bool merging,
                   const std::function<std::vector<Operand>(int64_t)>& operands_of) {
  const int64_t r = pair.rate, segment = pair.segment / r;
  auto views_of = [&](int64_t j) {
    std::vector<TensorView> views;
    for (const Operand& op : operands_of(j)) views.push_back(op.view);
    return views;
  };
  const Kernel& plain = merging ? attention_fp8_merging() : attention_fp8();
  const int64_t rows = S / r;
  if (S % r == 0 && rows <= segment) return {&plain, causal, causal, rows, offset_launches(r, views_of)};
  if (segments_as_heads_fit(pair, S)) {
    const std::vector<Operand> ops = operands_of(0);
    std::vector<TensorView> args;
    for (const Operand& op : ops)
      if (op.rows_dim == kSegmentsAsHeads) args.push_back(op.view);
      else if (auto t = dilated_segments_as_heads(op.view, op.rows_dim, rows / segment)) args.push_back(*t);
    if (args.size() == ops.size()) return {&plain, causal, causal, segment, {std::move(args)}};
    for (const Operand& op : ops)   // dilated_attention_fp8 checked o before
      if (op.rows_dim == kSegmentsAsHeads)
        throw Error("dilated attention: internal error: a pair's FP8 Vᵀ is stored by segment, but its other views do not "
                    "run the segments as heads");
  }
  return {&pair_kernel(pair, causal, merging), false, true, (S + r - 1) / r, offset_launches(r, views_of)};
}
}  // namespace

bool dilated_fp8_quantize_once_fits(int64_t S, const std::vector<DilatedPair>& pairs) {
  for (const auto& [w, r] : pairs)
    if (r < 1 || S % r != 0 || (S / r) % 16 != 0) return false;
  return true;
}

void dilated_quantize(const TensorView& q, const TensorView& k, const TensorView& v, const std::vector<DilatedPair>& pairs,
                      DilatedFp8Inputs& in, CUstream stream) {
  check_pairs(q, k, v, q, pairs, "dilated_quantize");
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3];
  if (!dilated_fp8_quantize_once_fits(S, pairs))
    throw Error(fmt::format("dilated_quantize: S = {} must be a multiple of 16·r for every rate r (each offset's keys of "
                            "Vᵀ start 16-byte aligned); dilated_attention_forward quantizes view by view otherwise",
                            S));
  auto ensure = [](std::optional<DeviceTensor>& t, DType dt, std::vector<int64_t> shape) {
    if (!t || t->dtype() != dt || t->shape() != shape) t.emplace(dt, shape);
  };
  ensure(in.q8, DType::e4m3, {B, H, S, D});
  ensure(in.k8, DType::e4m3, {B, H, S, D});
  ensure(in.qd, DType::f32, {B, H});
  ensure(in.kd, DType::f32, {B, H});
  LaunchOptions lo;
  lo.stream = stream;
  quantize_fp8_per_head(q, in.partial, in.q8->view(), in.qd->view(), /*transpose=*/false, lo);
  quantize_fp8_per_head(k, in.partial, in.k8->view(), in.kd->view(), /*transpose=*/false, lo);
  in.vt8.clear();
  in.vd.clear();
  // V's chunk amaxes once, over whole heads: every pair quantizes its rows of a head with the whole
  // head's descale, and only the heads that read them (offset j: heads j, j + r, ...), instead of
  // an amax pass and a quantizer pass over all of V per pair. That needs each view to give every
  // chunk rows (the quantizer cuts its rows into as many chunks as there are amaxes); else each
  // view takes its own amax.
  int64_t fewest_rows = S;
  for (const auto& pair : pairs) fewest_rows = std::min(fewest_rows, segments_as_heads_fit(pair, S) ? pair.segment : S / pair.rate);
  const bool whole_head_amax = fewest_rows >= 64 * attention_fp8_quantize_chunks(B * H, S);
  std::optional<TensorView> v_chunks;   // [B, H, C]
  if (whole_head_amax) v_chunks = chunk_amaxes(v, in.partial, lo);
  // x's Vᵀ and descales, with `chunks_of(v_chunks)` the chunk amaxes of x's heads (whole_head_amax),
  // else x's own.
  auto quantize_v = [&](const TensorView& x, const std::function<TensorView(const TensorView&)>& chunks_of,
                        const TensorView& y, const TensorView& descale) {
    if (v_chunks) quantize_with_chunk_amaxes(x, chunks_of(*v_chunks), y, descale, /*transpose=*/true, lo);
    else quantize_fp8_per_head(x, in.partial, y, descale, /*transpose=*/true, lo);
  };
  auto same_heads = [](const TensorView& chunks) { return chunks; };
  for (const auto& pair : pairs) {
    const auto [w, r] = pair;
    if (segments_as_heads_fit(pair, S)) {   // segment c's Vᵀ [B, H, D, w] at [:, :, c], its descale too
      const int64_t count = S / w;
      in.vt8.emplace_back(DType::e4m3, std::vector<int64_t>{B, H, count, D, w});
      in.vd.emplace_back(DType::f32, std::vector<int64_t>{B, H, count});
      // One quantizer launch with the segments as heads where v's batch entries allow it.
      if (auto segments = dilated_segments_as_heads(v, 2, count)) {
        quantize_v(*segments, [&](const TensorView& chunks) { return *dilated_segments_as_heads(chunks, -1, count); },
                   batch_and_heads_as_one(in.vt8.back().view()), batch_and_heads_as_one(in.vd.back().view()));
        continue;
      }
      for (int64_t c = 0; c < count; ++c)
        quantize_v(slice(v, 2, c * w, w), same_heads, at(in.vt8.back().view(), 2, c), at(in.vd.back().view(), 2, c));
      continue;
    }
    in.vt8.emplace_back(DType::e4m3, std::vector<int64_t>{B, H, D, S});
    in.vd.emplace_back(DType::f32, std::vector<int64_t>{r, B, H});
    for (int64_t j = 0; j < r; ++j)
      quantize_v(sparse(v, j, r), [&](const TensorView& chunks) { return every(chunks, 1, j, r); },
                 every(columns(in.vt8.back().view(), j * (S / r), S / r), 1, j, r), every(entry(in.vd.back().view(), j), 1, j, r));
  }
}

void dilated_attention_fp8(const DilatedFp8Inputs& in, const TensorView& o, const DilatedOptions& opt, DilatedWorkspace& ws) {
  bool quantized_for_pairs = in.q8 && in.vt8.size() == opt.pairs.size();
  for (size_t p = 0; quantized_for_pairs && p < opt.pairs.size(); ++p) {
    const int64_t S = in.q8->shape()[2];   // Vᵀ of a pair of whole segments lies by segment
    quantized_for_pairs = (in.vt8[p].shape().size() == 5) == segments_as_heads_fit(opt.pairs[p], S);
  }
  if (!quantized_for_pairs)
    throw Error("dilated_attention_fp8: the inputs were not quantized for these pairs (run dilated_quantize first)");
  const TensorView q8 = in.q8->view();
  check_pairs(q8, in.k8->view(), q8, o, opt.pairs, "dilated_attention_fp8");
  const int64_t S = q8.shape[2], D = q8.shape[3];
  for (const DilatedPair& pair : opt.pairs)
    if (segments_as_heads_fit(pair, S) && !dilated_segments_as_heads(o, 2, S / pair.segment))
      throw Error(fmt::format("dilated_attention_fp8: o ({}) must hold its batch entries H heads apart (contiguous over "
                              "[B, H]): pair (segment {}, rate 1) runs its segments as heads of plain attention, and "
                              "dilated_quantize stored its V so",
                              o.describe(), pair.segment));
  ensure_lse(ws, q8);
  const PairOrder po = pair_order(opt.pairs);
  if (!po.first_writes) start_empty(o, ws, opt.stream);
  LaunchOptions lo;
  lo.stream = opt.stream;
  const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(D));
  for (size_t p : po.order) {
    const int64_t r = opt.pairs[p].rate;
    const bool merging = po.merges(p);
    // Vᵀ and its descales of a pair stored segment by segment are the segments as heads already.
    const bool by_segment = segments_as_heads_fit(opt.pairs[p], S);
    auto operands_of = [&](int64_t j) {
      const Operand vt = by_segment ? Operand{batch_and_heads_as_one(in.vt8[p].view()), kSegmentsAsHeads}
                                    : Operand{every(columns(in.vt8[p].view(), j * (S / r), S / r), 1, j, r), 3};
      const Operand vd = by_segment ? Operand{batch_and_heads_as_one(in.vd[p].view()), kSegmentsAsHeads}
                                    : Operand{every(entry(in.vd[p].view(), j), 1, j, r), -1};
      return std::vector<Operand>{{sparse(q8, j, r), 2},
                                  {sparse(in.k8->view(), j, r), 2},
                                  vt,
                                  {every(in.qd->view(), 1, j, r), -1},
                                  {every(in.kd->view(), 1, j, r), -1},
                                  vd,
                                  {sparse(o, j, r), 2},
                                  {sparse(ws.lse->view(), j, r), 2}};
    };
    const PairPlan plan = plan_pair(opt.pairs[p], S, opt.causal, merging, operands_of);
    lo.config = fp8_pair_config(opt.attention_config, *plan.kernel, D, plan.keys, merging, plan.masked);
    // Each launch after the first starts while the previous one ends: its main loop reads only the
    // quantized inputs, and it waits for the previous launch before it reads or writes o and the
    // LSE. (The first follows whatever came before, possibly the kernels that wrote its inputs.)
    lo.start_early = merging;
    for (const auto& t : plan.launches)
      launch(*plan.kernel, {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], scale, 1.0, plan.causal_flag, true}, lo);
  }
}

void dilated_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                               const DilatedOptions& opt, DilatedWorkspace& ws) {
  check_pairs(q, k, v, o, opt.pairs, "dilated_attention_forward");
  const int64_t S = q.shape[2], D = q.shape[3];
  if (opt.fp8 && dilated_fp8_quantize_once_fits(S, opt.pairs)) {
    dilated_quantize(q, k, v, opt.pairs, ws.fp8, opt.stream);
    dilated_attention_fp8(ws.fp8, o, opt, ws);
    return;
  }
  ensure_lse(ws, q);
  const PairOrder po = pair_order(opt.pairs);
  if (!po.first_writes) start_empty(o, ws, opt.stream);
  // The attentions of each pair (plan_pair): heads j, j + r, ... see rows j, j + r, ... of their
  // sequence, in segments of w / r of those rows.
  for (size_t p : po.order) {
    const int64_t r = opt.pairs[p].rate;
    const bool merging = po.merges(p);
    auto operands_of = [&](int64_t j) {
      return std::vector<Operand>{
          {sparse(q, j, r), 2}, {sparse(k, j, r), 2}, {sparse(v, j, r), 2}, {sparse(o, j, r), 2}, {sparse(ws.lse->view(), j, r), 2}};
    };
    const PairPlan plan = plan_pair(opt.pairs[p], S, opt.causal, merging, operands_of);
    AttentionFp8Options a;
    a.quantize = opt.fp8;
    a.kernel = plan.kernel;
    a.causal = plan.causal_flag;
    a.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
    a.attention_config = opt.fp8 && !merging
                             ? fp8_pair_config(opt.attention_config, *plan.kernel, D, plan.keys, false, plan.masked)
                             : opt.attention_config;
    a.stream = opt.stream;
    a.start_early = merging;   // as in dilated_attention_fp8 (where it quantizes, its first pre-pass starts early)
    for (const auto& t : plan.launches) {
      a.lse = t[4];
      attention_fp8_forward(t[0], t[1], t[2], t[3], a, ws.attention);
    }
  }
}

namespace {
// The backward of a pair's segment variant (w / r positions, causal or not), built once and kept.
const VariantBackward& pair_backward(const DilatedPair& pair, bool causal) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, bool>, std::unique_ptr<VariantBackward>> kernels;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<VariantBackward>& b = kernels[{pair.segment / pair.rate, causal}];
  if (!b) b = std::make_unique<VariantBackward>(attention_variant_backward(segment_variant(pair.segment / pair.rate, causal)));
  return *b;
}

// A contiguous f32 tensor as one row of its elements, and entry i of [3, ...].
TensorView flat(const TensorView& t) {
  TensorView f = t;
  f.shape = {t.numel()};
  f.strides = {};
  return f;
}
}  // namespace

std::vector<BackwardLaunch> dilated_backward_launches(const TensorView& q, const TensorView& k, const TensorView& v,
                                                      const TensorView& o, const TensorView& dout, const TensorView& lse,
                                                      const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                                      const DilatedOptions& opt, const TensorView& delta, const TensorView& lse2,
                                                      const TensorView& acc, const TensorView& part) {
  const char* who = "dilated_attention_backward";
  check_pairs(q, k, v, o, opt.pairs, who);
  if (opt.fp8) throw Error(fmt::format("{}: 16-bit only (no FP8 backward of dilated attention yet)", who));
  const std::vector<int64_t> rows = {q.shape[0], q.shape[1], q.shape[2]}, sums = {3, q.shape[0], q.shape[1], q.shape[2], q.shape[3]};
  if (lse.dtype != DType::f32 || lse.shape != rows)
    throw Error(fmt::format("{}: lse is {}: expected f32[{}, {}, {}] (the forward's running logsumexp, DilatedWorkspace::lse)", who,
                            lse.describe(), rows[0], rows[1], rows[2]));
  for (const auto& [what, t] : {std::pair<const char*, const TensorView*>{"do", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
    if (t->shape != q.shape) throw Error(fmt::format("{}: {} is {}: expected the shape of q, {}", who, what, t->describe(), q.describe()));
  for (const auto& [what, t] : {std::pair<const char*, const TensorView*>{"acc", &acc}, {"part", &part}})
    if (t->dtype != DType::f32 || t->shape != sums || !t->is_contiguous())
      throw Error(fmt::format("{}: its {} scratch is {}: expected contiguous f32[3, {}, {}, {}, {}]", who, what, t->describe(), sums[1],
                              sums[2], sums[3], sums[4]));
  const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(q.shape[3]));
  const TensorView grads[3] = {at(acc, 0, 0), at(acc, 0, 1), at(acc, 0, 2)}, parts[3] = {at(part, 0, 0), at(part, 0, 1), at(part, 0, 2)};
  std::vector<BackwardLaunch> out;
  out.push_back({&attention_bwd_prepare(), {o, dout, lse, delta, lse2}});
  out.push_back({&fill_zeros(), {flat(acc)}});
  // Each pair's part: heads j, j + r, ... over rows j, j + r, ... (the forward's views), its segment
  // mask on them; dK / dV and dQ into the scratch, then added into the sums.
  for (const DilatedPair& pair : opt.pairs) {
    const VariantBackward& b = pair_backward(pair, opt.causal);
    for (int64_t j = 0; j < pair.rate; ++j) {
      auto view = [&](const TensorView& t) { return sparse(t, j, pair.rate); };
      out.push_back({&b.dkdv, {view(q), view(k), view(v), view(dout), view(lse2), view(delta), view(parts[1]), view(parts[2]), scale,
                               opt.causal}});
      out.push_back({&b.dq, {view(q), view(k), view(v), view(dout), view(lse2), view(delta), view(parts[0]), scale, opt.causal}});
      for (int g = 0; g < 3; ++g) out.push_back({&accumulate(), {view(grads[g]), view(parts[g])}});
    }
  }
  out.push_back({&convert(), {grads[0], dq}});
  out.push_back({&convert(), {grads[1], dk}});
  out.push_back({&convert(), {grads[2], dv}});
  return out;
}

void dilated_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const DilatedOptions& opt, DilatedBackwardWorkspace& ws) {
  check_pairs(q, k, v, o, opt.pairs, "dilated_attention_backward");
  const std::vector<int64_t> rows = {q.shape[0], q.shape[1], q.shape[2]}, sums = {3, q.shape[0], q.shape[1], q.shape[2], q.shape[3]};
  for (auto* t : {&ws.delta, &ws.lse2})
    if (!*t || (*t)->shape() != rows) t->emplace(DType::f32, rows);
  for (auto* t : {&ws.acc, &ws.part})
    if (!*t || (*t)->shape() != sums) t->emplace(DType::f32, sums);
  LaunchOptions lo;
  lo.stream = opt.stream;
  for (const BackwardLaunch& l : dilated_backward_launches(q, k, v, o, dout, lse, dq, dk, dv, opt, ws.delta->view(), ws.lse2->view(),
                                                           ws.acc->view(), ws.part->view()))
    launch(*l.kernel, l.args, lo);
}

}  // namespace tj::kernels
