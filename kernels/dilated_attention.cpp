#include "kernels/dilated_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/attention_variants.h"
#include "runtime/error.h"
#include "runtime/jit.h"

namespace tj::kernels {

namespace {

// Every `step`-th index of dimension `dim` from `first` on.
TensorView every(const TensorView& t, int dim, int64_t first, int64_t step) {
  TensorView s = t;
  s.strides = t.effective_strides();
  s.data = static_cast<char*>(t.data) + first * s.strides[dim] * size_bytes(t.dtype);
  s.shape[dim] = (t.shape[dim] - first + step - 1) / step;
  s.strides[dim] *= step;
  return s;
}

// Entry p of a stacked tensor [P, ...].
TensorView entry(const TensorView& t, int64_t p) {
  TensorView s = t;
  s.strides = t.effective_strides();
  s.data = static_cast<char*>(t.data) + p * s.strides[0] * size_bytes(t.dtype);
  s.shape.erase(s.shape.begin());
  s.strides.erase(s.strides.begin());
  return s;
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
  TensorView s = t;
  s.strides = t.effective_strides();
  s.data = static_cast<char*>(t.data) + first * s.strides.back() * size_bytes(t.dtype);
  s.shape.back() = count;
  return s;
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

// The config of a pair's launches in fp8: `given` or the default for its rows; the pair that
// writes takes its LSE from the e4m3 P's sums as the merging ones do (knob attn_lse_e4m3_sums),
// so that every pair weighs its keys as its O does.
Config fp8_pair_config(const std::optional<Config>& given, const Kernel& kernel, int64_t D, int64_t keys, bool merging) {
  Config c = given ? *given : attention_variant_default_config(kernel.name(), DType::e4m3, D, true, D, keys, false);
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
  for (const auto& [w, r] : pairs) {
    in.vt8.emplace_back(DType::e4m3, std::vector<int64_t>{B, H, D, S});
    in.vd.emplace_back(DType::f32, std::vector<int64_t>{r, B, H});
    for (int64_t j = 0; j < r; ++j)
      quantize_fp8_per_head(every(v, 2, j, r), in.partial, columns(in.vt8.back().view(), j * (S / r), S / r),
                            entry(in.vd.back().view(), j), /*transpose=*/true, lo);
  }
}

void dilated_attention_fp8(const DilatedFp8Inputs& in, const TensorView& o, const DilatedOptions& opt, DilatedWorkspace& ws) {
  if (!in.q8 || in.vt8.size() != opt.pairs.size())
    throw Error("dilated_attention_fp8: the inputs were not quantized for these pairs (run dilated_quantize first)");
  const TensorView q8 = in.q8->view();
  check_pairs(q8, in.k8->view(), q8, o, opt.pairs, "dilated_attention_fp8");
  const int64_t S = q8.shape[2], D = q8.shape[3];
  ensure_lse(ws, q8);
  const PairOrder po = pair_order(opt.pairs);
  if (!po.first_writes) start_empty(o, ws, opt.stream);
  LaunchOptions lo;
  lo.stream = opt.stream;
  const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(D));
  for (size_t p : po.order) {
    const int64_t r = opt.pairs[p].rate;
    const bool merging = po.merges(p);
    const Kernel& segments = pair_kernel(opt.pairs[p], opt.causal, merging);
    lo.config = fp8_pair_config(opt.attention_config, segments, D, S / r, merging);
    // Each launch after the first starts while the previous one ends: its main loop reads only the
    // quantized inputs, and it waits for the previous launch before it reads or writes o and the
    // LSE. (The first follows whatever came before, possibly the kernels that wrote its inputs.)
    lo.start_early = merging;
    for (int64_t j = 0; j < r; ++j) {
      const TensorView vt = every(columns(in.vt8[p].view(), j * (S / r), S / r), 1, j, r);
      const TensorView vd = every(entry(in.vd[p].view(), j), 1, j, r);
      launch(segments,
             {sparse(q8, j, r), sparse(in.k8->view(), j, r), vt, every(in.qd->view(), 1, j, r),
              every(in.kd->view(), 1, j, r), vd, sparse(o, j, r), sparse(ws.lse->view(), j, r), scale, 1.0, false, true},
             lo);
    }
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
  // One attention per (pair, offset): heads j, j + r, ... see rows j, j + r, ... of their
  // sequence, in segments of w / r of those rows.
  for (size_t p : po.order) {
    const int64_t r = opt.pairs[p].rate;
    const bool merging = po.merges(p);
    const Kernel& segments = pair_kernel(opt.pairs[p], opt.causal, merging);
    for (int64_t j = 0; j < r; ++j) {
      AttentionFp8Options a;
      a.quantize = opt.fp8;
      a.kernel = &segments;
      a.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
      a.lse = sparse(ws.lse->view(), j, r);
      a.attention_config = opt.fp8 && !merging ? fp8_pair_config(opt.attention_config, segments, D, S / r, false)
                                               : opt.attention_config;
      a.stream = opt.stream;
      a.start_early = merging;   // as in dilated_attention_fp8 (ignored where it quantizes)
      attention_fp8_forward(sparse(q, j, r), sparse(k, j, r), sparse(v, j, r), sparse(o, j, r), a, ws.attention);
    }
  }
}

}  // namespace tj::kernels
