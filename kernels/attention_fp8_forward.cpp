// The host pipeline of kernels/attention_fp8.h: quantize pre-passes, then attention_fp8.
#include <fmt/format.h>

#include <cmath>

#include "kernels/attention_fp8.h"
#include "kernels/library.h"
#include "runtime/error.h"
#include "runtime/jit.h"

namespace tj::kernels {

Config attention_fp8_default_config(DType in, int64_t head_dim, bool causal) {
  Config c;
  int64_t bn = 128;
  if (!is_fp8(in) && head_dim == 256) bn = 64;
  c.blocks = {{"m", 128}, {"n", bn}};
  c.num_stages = 2;
  (void)causal;
  return c;
}

namespace {
void ensure(std::optional<DeviceTensor>& t, DType dt, const std::vector<int64_t>& shape, bool zero = false) {
  if (t && t->dtype() == dt && t->shape() == shape) return;
  t.emplace(dt, shape);
  if (zero) t->fill_bytes(0);
}
}  // namespace

void attention_fp8_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                           const AttentionFp8Options& opt, AttentionFp8Workspace& ws) {
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4 || o.rank() != 4)
    throw Error("attention_fp8_forward: q, k, v and o must be rank 4 ([B, H, S, D])");
  const int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Skv = k.shape[2];
  if (k.shape[0] != B || v.shape != k.shape || k.shape[3] != D || o.shape != q.shape)
    throw Error(fmt::format("attention_fp8_forward: shapes q {} k {} v {} o {} do not fit", q.describe(), k.describe(),
                            v.describe(), o.describe()));
  LaunchOptions lo;
  lo.stream = opt.stream;
  const double scale = opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(D))) * 1.4426950408889634;
  Config cfg = opt.attention_config.value_or(attention_fp8_default_config(opt.quantize ? DType::e4m3 : q.dtype, D, opt.causal));
  ensure(ws.no_lse, DType::f32, {1});
  TensorView lse = opt.lse.value_or(ws.no_lse->view());
  const bool with_lse = opt.lse.has_value();
  LaunchOptions ao = lo;
  ao.config = cfg;
  if (!opt.quantize) {
    if (!ws.ones || ws.ones->shape() != std::vector<int64_t>{B, Hkv}) {
      HostTensor h(DType::f32, {B, Hkv});
      for (int64_t i = 0; i < h.numel(); ++i) h.set(i, 1.0);
      ws.ones.emplace(DeviceTensor::from_host(h));
    }
    TensorView one = ws.ones->view();
    launch(attention_fp8(), {q, k, v, one, one, one, o, lse, scale, static_cast<double>(opt.o_scale), opt.causal, with_lse}, ao);
    return;
  }
  // q's descales are per query head; attention_fp8 reads them per (b, kv head): fine when H == Hkv
  // (grouped-query attention would need a per-kv-head amax over the group's query heads).
  if (H != Hkv)
    throw Error("attention_fp8_forward: grouped-query inputs (H != Hkv) need q descales per kv head; not supported yet");
  const int64_t S_pad = (Skv + 15) / 16 * 16;
  ensure(ws.q8, DType::e4m3, {B, H, Sq, D});
  ensure(ws.k8, DType::e4m3, {B, Hkv, Skv, D});
  ensure(ws.vt8, DType::e4m3, {B, Hkv, D, S_pad}, /*zero=*/true);   // the pad past Skv must be finite
  ensure(ws.qd, DType::f32, {B, H});
  ensure(ws.kd, DType::f32, {B, Hkv});
  ensure(ws.vd, DType::f32, {B, Hkv});
  // The pre-pass kernels run SIMT; blocks of 64 rows (a multiple of 16 keeps Vt's pad zero).
  Config qcfg;
  qcfg.blocks = {{"s", 64}, {"s2", 64}};
  LaunchOptions qo = lo;
  qo.config = qcfg;
  launch(quantize_fp8(), {q, ws.q8->view(), ws.qd->view()}, qo);
  launch(quantize_fp8(), {k, ws.k8->view(), ws.kd->view()}, qo);
  launch(quantize_transpose_fp8(), {v, ws.vt8->view(), ws.vd->view()}, qo);
  launch(attention_fp8(),
         {ws.q8->view(), ws.k8->view(), ws.vt8->view(), ws.qd->view(), ws.kd->view(), ws.vd->view(), o, lse, scale,
          static_cast<double>(opt.o_scale), opt.causal, with_lse},
         ao);
}

}  // namespace tj::kernels
