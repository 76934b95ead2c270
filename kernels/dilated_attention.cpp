#include "kernels/dilated_attention.h"

#include <fmt/format.h>

#include <cmath>

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

}  // namespace

const Kernel& dilated_merge() {
  static const Kernel k = kernel("dilated_merge", {"parts", "lse", "rates", "o"}, [](In parts, In lse, In rates, Out o) {
    const int64_t P = *parts.static_dim(0);
    auto [B, H, S, D] = o.shape<4>();
    for (auto bh : grid(B * H)) {
      auto b = floordiv(bh, H);
      auto h = bh % H;
      for (auto s : tile(S, block("s"))) {
        std::vector<Tile> weight_log;   // lse of pair p where it covers the row, else -inf
        for (int64_t p = 0; p < P; ++p) {
          auto r = rates.load(p).to(DType::i32);
          auto covered = s.index() % r == (h % rates.load(p)).to(DType::i32);
          weight_log.push_back(where(covered, lse.load(p, b, h, s), -INFINITY));
        }
        Tile top = weight_log[0];
        for (int64_t p = 1; p < P; ++p) top = maximum(top, weight_log[p]);
        auto top_safe = where(top == -INFINITY, 0.0, top);
        Tile den = zeros({s}, DType::f32), acc = zeros({s, D}, DType::f32);
        for (int64_t p = 0; p < P; ++p) {
          auto w = exp(weight_log[p] - top_safe);
          den = den + w;
          acc = acc + where(w.col() > 0.0, parts.load(p, b, h, s, all).to(DType::f32), 0.0) * w.col();
        }
        o.store(b, h, s, all, (acc * where(den > 0.0, 1.0 / den, 0.0).col()).to(o.dtype()));
      }
    }
  });
  return k;
}

namespace {

// Columns [first, first + count) of the last dim.
TensorView columns(const TensorView& t, int64_t first, int64_t count) {
  TensorView s = t;
  s.strides = t.effective_strides();
  s.data = static_cast<char*>(t.data) + first * s.strides.back() * size_bytes(t.dtype);
  s.shape.back() = count;
  return s;
}

// The pairs' rates as a device tensor, and the checks every path shares; returns P.
int64_t check_pairs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
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
  return P;
}

void ensure_parts(DilatedWorkspace& ws, const std::vector<DilatedPair>& pairs, const TensorView& q) {
  const int64_t P = static_cast<int64_t>(pairs.size());
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3];
  if (!ws.parts || ws.parts->shape() != std::vector<int64_t>{P, B, H, S, D} || ws.parts->dtype() != q.dtype) {
    ws.parts.emplace(q.dtype, std::vector<int64_t>{P, B, H, S, D});
    ws.lse.emplace(DType::f32, std::vector<int64_t>{P, B, H, S});
  }
  // Uploaded only when the rates change. A new tensor means a copy from the host and the old
  // one's free, and the free waits for the device to finish: every call then ran its launches
  // on an idle GPU (H200, session 18, with attention_fp8_forward's unit descales reallocated per
  // pair too: bf16 S 2048 took 0.978 ms instead of 0.805, fp8 0.731 instead of 0.681).
  std::vector<int64_t> rates;
  for (const auto& pair : pairs) rates.push_back(pair.rate);
  if (ws.rates && ws.rates_held == rates) return;
  HostTensor host(DType::i64, {P});
  for (int64_t p = 0; p < P; ++p) host.set(p, static_cast<double>(rates[p]));
  ws.rates.emplace(DeviceTensor::from_host(host));
  ws.rates_held = std::move(rates);
}

void merge(const TensorView& o, DilatedWorkspace& ws, CUstream stream) {
  LaunchOptions lo;
  lo.stream = stream;
  // Tiles of 32 rows on eight warps, 8 adjacent columns per thread (16-byte loads). H200, session
  // 18, three bf16 parts [8, 16, 2048, 128]: 86.3 us vs 156.6 at 64 rows on four warps of scalar
  // loads, 100.3 without the vectors; the other shapes measured were in between.
  lo.config = Config();
  lo.config->blocks = {{"s", 32}};
  lo.config->num_warps = 8;
  lo.config->knobs = {{"simt_vec", 8}};
  launch(dilated_merge(), {ws.parts->view(), ws.lse->view(), ws.rates->view(), o}, lo);
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
  const int64_t P = check_pairs(q8, in.k8->view(), q8, o, opt.pairs, "dilated_attention_fp8");
  const int64_t S = q8.shape[2], D = q8.shape[3];
  ensure_parts(ws, opt.pairs, o);
  LaunchOptions lo;
  lo.stream = opt.stream;
  const double scale = 1.4426950408889634 / std::sqrt(static_cast<double>(D));
  for (int64_t p = 0; p < P; ++p) {
    const auto [w, r] = opt.pairs[p];
    const AttentionVariant variant = segment_variant(w / r, opt.causal);
    const Kernel segments = attention_variant(variant);
    lo.config = opt.attention_config ? *opt.attention_config
                                     : attention_variant_default_config(segments.name(), DType::e4m3, D, true, D, S / r, true);
    for (int64_t j = 0; j < r; ++j) {
      const TensorView vt = every(columns(in.vt8[p].view(), j * (S / r), S / r), 1, j, r);
      const TensorView vd = every(entry(in.vd[p].view(), j), 1, j, r);
      launch(segments,
             {sparse(q8, j, r), sparse(in.k8->view(), j, r), vt, every(in.qd->view(), 1, j, r),
              every(in.kd->view(), 1, j, r), vd, sparse(entry(ws.parts->view(), p), j, r),
              sparse(entry(ws.lse->view(), p), j, r), scale, 1.0, false, true},
             lo);
    }
  }
  merge(o, ws, opt.stream);
}

void dilated_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                               const DilatedOptions& opt, DilatedWorkspace& ws) {
  const int64_t P = check_pairs(q, k, v, o, opt.pairs, "dilated_attention_forward");
  const int64_t S = q.shape[2], D = q.shape[3];
  if (opt.fp8 && dilated_fp8_quantize_once_fits(S, opt.pairs)) {
    dilated_quantize(q, k, v, opt.pairs, ws.fp8, opt.stream);
    dilated_attention_fp8(ws.fp8, o, opt, ws);
    return;
  }
  ensure_parts(ws, opt.pairs, q);
  // One attention per (pair, offset): heads j, j + r, ... see rows j, j + r, ... of their
  // sequence, in segments of w / r of those rows.
  for (int64_t p = 0; p < P; ++p) {
    const auto [w, r] = opt.pairs[p];
    const Kernel segments = attention_variant(segment_variant(w / r, opt.causal));
    for (int64_t j = 0; j < r; ++j) {
      AttentionFp8Options a;
      a.quantize = opt.fp8;
      a.kernel = &segments;
      a.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
      a.lse = sparse(entry(ws.lse->view(), p), j, r);
      a.attention_config = opt.attention_config;
      a.stream = opt.stream;
      attention_fp8_forward(sparse(q, j, r), sparse(k, j, r), sparse(v, j, r), sparse(entry(ws.parts->view(), p), j, r), a,
                            ws.attention);
    }
  }
  merge(o, ws, opt.stream);
}

}  // namespace tj::kernels
