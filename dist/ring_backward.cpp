#include "dist/ring_backward.h"

#include <fmt/format.h>

#include <cmath>

#include "autotune/launch.h"
#include "core/error.h"
#include "dist/nccl_util.h"
#include "dist/ring_attention.h"
#include "kernels/attention_backward.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"

namespace tj::dist {

using kernels::RingPlan;

namespace {

constexpr const char* kWho = "ring attention backward";

// A slot: K and V in the inputs' dtype, then dK and dV in f32 (each 256 bytes aligned).
struct Slot {
  std::vector<int64_t> shape;
  DType dt;
  int64_t v_off = 0, dk_off = 0, dv_off = 0, bytes = 0;
  Slot(const TensorView& k) : shape(k.shape), dt(k.dtype) {
    const int64_t elems = k.numel();
    v_off = round_up(elems * size_bytes(dt), 256);
    dk_off = v_off + round_up(elems * size_bytes(dt), 256);
    dv_off = dk_off + round_up(elems * 4, 256);
    bytes = dv_off + elems * 4;
  }
  TensorView k(const DeviceTensor& s) const { return byte_view(s, 0, dt, shape); }
  TensorView v(const DeviceTensor& s) const { return byte_view(s, v_off, dt, shape); }
  TensorView dk(const DeviceTensor& s) const { return byte_view(s, dk_off, DType::f32, shape); }
  TensorView dv(const DeviceTensor& s) const { return byte_view(s, dv_off, DType::f32, shape); }
};

// [B, H, n, D] -> [1, 1, B·H·n, D] of a contiguous tensor (convert's rank-4 rows).
TensorView as_rows(const TensorView& t) {
  TensorView r = t;
  r.shape = {1, 1, t.numel() / t.shape.back(), t.shape.back()};
  r.strides = {};
  return r;
}

}  // namespace

RingPlan ring_backward_plan(int64_t ranks, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                            const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                            const TensorView& dv, const RingBackwardOptions& opt) {
  RingAttentionOptions ro;
  ro.sharding = opt.sharding;
  ro.causal = opt.causal;
  ro.window = opt.window;
  ro.lse = lse;
  RingPlan plan = ring_attention_plan(ranks, q, k, v, o, ro);
  // ring_attention_plan checked k / v against q (grouped-query heads: Hkv dividing H).
  const std::pair<const char*, const TensorView*> same[] = {{"do", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& [what, t] : same) {
    const TensorView& like = t == &dk || t == &dv ? k : q;
    if (t->shape != like.shape)
      throw Error(fmt::format("{}: {} is {}: expected the shape of {}, {}", kWho, what, t->describe(), &like == &k ? "k" : "q",
                              like.describe()));
    if (!t->is_contiguous()) throw Error(fmt::format("{}: {} is {}: expected a contiguous tensor", kWho, what, t->describe()));
  }
  if (dout.dtype != q.dtype) throw Error(fmt::format("{}: do is {}: expected q's dtype, {}", kWho, dout.describe(), name(q.dtype)));
  return plan;
}

void ring_attention_backward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                             const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                             const TensorView& dv, const RingBackwardOptions& opt, RingBackwardWorkspace& ws) {
  runtime::current_device();
  int rank = opt.local_rank, ranks = opt.local_ranks;
  if (opt.local_only) {
    if (ranks < 1 || rank < 0 || rank >= ranks)
      throw Error(fmt::format("{}: local_only as rank {} of {} ranks", kWho, rank, ranks));
  } else {
    const RankOf r = rank_of(comm, kWho);
    rank = r.rank;
    ranks = r.ranks;
  }
  const RingPlan plan = ring_backward_plan(ranks, q, k, v, o, dout, lse, dq, dk, dv, opt);
  const int64_t B = q.shape[0], H = q.shape[1], n = q.shape[2], D = q.shape[3], L = plan.chunk_rows(), P = plan.ranks;
  const CUstream stream = opt.stream;
  const Slot layout(k);
  for (auto& s : ws.slot) ensure_tensor(s, DType::e4m3, {layout.bytes});   // bytes
  ensure_tensor(ws.delta, DType::f32, {B, H, n});
  ensure_tensor(ws.lse2, DType::f32, {B, H, n});
  ensure_tensor(ws.dq_acc, DType::f32, {B, H, n, D});
  ensure_tensor(ws.dk_part, DType::f32, {B, H, L, D});
  ensure_tensor(ws.dv_part, DType::f32, {B, H, L, D});
  if (plan.window > 0) ensure_tensor(ws.dq_part, DType::f32, {B, H, L, D});
  if (!ws.comm) ws.comm.emplace(runtime::Stream::greatest_priority());
  while (ws.sync.size() < static_cast<size_t>(2 * P)) ws.sync.emplace_back(CU_EVENT_DISABLE_TIMING);
  const CUstream cs = ws.comm->get();

  LaunchOptions lo;
  lo.stream = stream;
  launch(kernels::attention_bwd_prepare(), {o, dout, lse, ws.delta->view(), ws.lse2->view()}, lo);
  zero_async(ws.dq_acc->view(), stream);
  const DeviceTensor& home = *ws.slot[0];
  copy_async(layout.k(home), k, stream);
  copy_async(layout.v(home), v, stream);
  zero_async(layout.dk(home), stream);
  zero_async(layout.dv(home), stream);

  const double scale = 1.4426950408889634 * opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const bool ring = !opt.local_only && P > 1;
  const int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  for (int64_t s = 0; s < P; ++s) {
    const DeviceTensor& held = *ws.slot[ring ? s % 2 : 0];
    if (ring && s >= 1) wait_event(stream, ws.sync[2 * (s - 1) + 1].get());
    const kernels::RingBackwardViews views{q,
                                           dout,
                                           ws.lse2->view(),
                                           ws.delta->view(),
                                           ws.dq_acc->view(),
                                           layout.k(held),
                                           layout.v(held),
                                           layout.dk(held),
                                           layout.dv(held),
                                           ws.dk_part->view(),
                                           ws.dv_part->view(),
                                           scale,
                                           plan.window > 0 ? ws.dq_part->view() : TensorView{}};
    for (const kernels::BackwardLaunch& l : kernels::ring_backward_step_launches(plan, rank, s, views)) launch(*l.kernel, l.args, lo);
    ws.sync[2 * s].record(stream);
    if (!ring) continue;
    // The shard moves on once this step has used it: K, V and its gradients to rank + 1, the next
    // from rank - 1 into the slot step s - 1 used. After the last step only the gradients travel,
    // home to their owner.
    wait_event(cs, ws.sync[2 * s].get());
    const bool last = s + 1 == P;
    const int64_t from = last ? layout.dk_off : 0, bytes = layout.bytes - from;
    nccl_check(ncclGroupStart(), kWho, "ncclGroupStart");
    nccl_check(ncclSend(static_cast<char*>(held.view().data) + from, bytes, ncclUint8, next, comm, cs), kWho, "ncclSend");
    nccl_check(ncclRecv(static_cast<char*>(ws.slot[(s + 1) % 2]->view().data) + from, bytes, ncclUint8, prev, comm, cs), kWho,
               "ncclRecv");
    nccl_check(ncclGroupEnd(), kWho, "ncclGroupEnd");
    ws.sync[2 * s + 1].record(cs);
  }
  if (ring) wait_event(stream, ws.sync[2 * (P - 1) + 1].get());
  // This rank's own shard's gradients are home (slot P mod 2; slot 0 for a ring of one).
  const DeviceTensor& own = *ws.slot[ring ? P % 2 : 0];
  LaunchOptions c = lo;
  c.config = Config();
  c.config->blocks = {{"r", 64}, {"c", 64}};
  launch(kernels::convert(), {as_rows(ws.dq_acc->view()), as_rows(dq)}, c);
  launch(kernels::convert(), {as_rows(layout.dk(own)), as_rows(dk)}, c);
  launch(kernels::convert(), {as_rows(layout.dv(own)), as_rows(dv)}, c);
}

}  // namespace tj::dist
