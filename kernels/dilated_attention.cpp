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

void dilated_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                               const DilatedOptions& opt, DilatedWorkspace& ws) {
  const int64_t P = static_cast<int64_t>(opt.pairs.size());
  if (P == 0) throw Error("dilated_attention_forward: no (segment, rate) pairs");
  if (q.rank() != 4 || k.shape != q.shape || v.shape != q.shape || o.shape != q.shape)
    throw Error(fmt::format("dilated_attention_forward: q, k, v and o must all be [B, H, S, D]; got q {} k {} v {} o {}",
                            q.describe(), k.describe(), v.describe(), o.describe()));
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3];
  HostTensor rates(DType::i64, {P});
  for (int64_t p = 0; p < P; ++p) {
    const auto [w, r] = opt.pairs[p];
    if (w < 1 || r < 1 || w % r != 0 || H % r != 0)
      throw Error(fmt::format("dilated_attention_forward: pair (segment {}, rate {}): the rate must divide the segment "
                              "length and the number of heads ({})",
                              w, r, H));
    rates.set(p, static_cast<double>(r));
  }
  if (!ws.parts || ws.parts->shape() != std::vector<int64_t>{P, B, H, S, D}) {
    ws.parts.emplace(q.dtype, std::vector<int64_t>{P, B, H, S, D});
    ws.lse.emplace(DType::f32, std::vector<int64_t>{P, B, H, S});
  }
  ws.rates.emplace(DeviceTensor::from_host(rates));
  // One attention per (pair, offset): heads j, j + r, ... see rows j, j + r, ... of their
  // sequence, in segments of w / r of those rows.
  for (int64_t p = 0; p < P; ++p) {
    const auto [w, r] = opt.pairs[p];
    const Kernel segments = attention_variant(segment_variant(w / r, opt.causal));
    for (int64_t j = 0; j < r; ++j) {
      auto sparse = [&](const TensorView& t) { return every(every(t, 1, j, r), 2, j, r); };
      AttentionFp8Options a;
      a.quantize = opt.fp8;
      a.kernel = &segments;
      a.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
      a.lse = sparse(entry(ws.lse->view(), p));
      a.stream = opt.stream;
      attention_fp8_forward(sparse(q), sparse(k), sparse(v), sparse(entry(ws.parts->view(), p)), a, ws.attention);
    }
  }
  LaunchOptions lo;
  lo.stream = opt.stream;
  lo.config = Config();
  lo.config->blocks = {{"s", 64}};
  launch(dilated_merge(), {ws.parts->view(), ws.lse->view(), ws.rates->view(), o}, lo);
}

}  // namespace tj::kernels
