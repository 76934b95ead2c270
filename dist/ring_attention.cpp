#include "dist/ring_attention.h"

#include <fmt/format.h>

#include <cmath>

#include "autotune/launch.h"
#include "core/error.h"
#include "dist/nccl_util.h"
#include "kernels/attention_variant.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"

namespace tj::dist {

using kernels::RingPlan;

namespace {

constexpr int64_t kAlign = 256;   // each tensor of a slot starts 256 bytes in (TMA wants 16)

TensorView slice(const TensorView& t, int dim, int64_t start, int64_t len) { return slice_of(t, dim, start, len); }

// Where a slot holds the travelling shard: K then V (16-bit), or K8, Vᵀ8 (rows padded to 16 keys)
// and the K / V descales per (b, h) of the shard (fp8).
struct SlotLayout {
  int64_t B = 0, Hkv = 0, n = 0, D = 0;
  bool fp8 = false;
  DType dt = DType::bf16;
  int64_t k_off = 0, v_off = 0, kd_off = 0, vd_off = 0, bytes = 0;

  SlotLayout(const TensorView& k, bool fp8_) : B(k.shape[0]), Hkv(k.shape[1]), n(k.shape[2]), D(k.shape[3]), fp8(fp8_), dt(k.dtype) {
    const int64_t kv = B * Hkv * D;
    if (!fp8) {
      v_off = round_up(kv * n * size_bytes(dt), kAlign);
      bytes = v_off + kv * n * size_bytes(dt);
      return;
    }
    v_off = round_up(kv * n, kAlign);
    kd_off = v_off + round_up(kv * round_up(n, 16), kAlign);
    vd_off = kd_off + round_up(B * Hkv * 4, kAlign);
    bytes = vd_off + B * Hkv * 4;
  }
  TensorView k(const DeviceTensor& s) const { return byte_view(s, k_off, fp8 ? DType::e4m3 : dt, {B, Hkv, n, D}); }
  TensorView v(const DeviceTensor& s) const {
    return fp8 ? byte_view(s, v_off, DType::e4m3, {B, Hkv, D, round_up(n, 16)}) : byte_view(s, v_off, dt, {B, Hkv, n, D});
  }
  TensorView kd(const DeviceTensor& s) const { return byte_view(s, kd_off, DType::f32, {B, Hkv}); }
  TensorView vd(const DeviceTensor& s) const { return byte_view(s, vd_off, DType::f32, {B, Hkv}); }
};

}  // namespace

RingPlan ring_attention_plan(int64_t ranks, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                             const RingAttentionOptions& opt) {
  auto fail = [](const std::string& why) { throw Error("ring attention: " + why); };
  const std::pair<const char*, const TensorView*> all[] = {{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}};
  for (const auto& [name, t] : all) {
    if (t->rank() != 4) fail(fmt::format("{} is {}: expected [B, H, n, D] (this rank's rows)", name, t->describe()));
    if (t->device != Device::cuda) fail(fmt::format("{} is {}: expected a device tensor", name, t->describe()));
    if (!t->is_contiguous()) fail(fmt::format("{} is {}: expected a contiguous tensor", name, t->describe()));
  }
  if (q.dtype != DType::bf16 && q.dtype != DType::f16)
    fail(fmt::format("q is {}: expected bf16 or f16 (fp8 = true quantizes them to e4m3 here)", q.describe()));
  if (k.dtype != q.dtype || v.dtype != q.dtype || o.dtype != q.dtype)
    fail(fmt::format("q, k, v and o must share one dtype: {}, {}, {}, {}", name(q.dtype), name(k.dtype), name(v.dtype),
                     name(o.dtype)));
  if (k.shape != v.shape) fail(fmt::format("k {} and v {} differ", k.describe(), v.describe()));
  if (o.shape != q.shape) fail(fmt::format("o {} differs from q {}", o.describe(), q.describe()));
  if (k.shape[0] != q.shape[0] || k.shape[2] != q.shape[2] || k.shape[3] != q.shape[3])
    fail(fmt::format("k {} must hold the same batch, rows and head dim as q {}", k.describe(), q.describe()));
  if (q.shape[1] % k.shape[1] != 0)
    fail(fmt::format("q's {} heads are not a multiple of k's {} (grouped-query attention)", q.shape[1], k.shape[1]));
  if (opt.lse && (opt.lse->dtype != DType::f32 || opt.lse->shape != std::vector<int64_t>{q.shape[0], q.shape[1], q.shape[2]}))
    fail(fmt::format("lse is {}: expected f32[{}, {}, {}]", opt.lse->describe(), q.shape[0], q.shape[1], q.shape[2]));
  RingPlan plan(ranks, ranks * q.shape[2], opt.sharding, opt.causal, opt.window);
  if (opt.fp8 && plan.chunk_rows() % 16 != 0)
    fail(fmt::format("fp8: chunks of {} rows ({}): each chunk of Vᵀ starts 16 bytes aligned only at a multiple of 16 rows; "
                     "pad the sequence to a multiple of {}",
                     plan.chunk_rows(), plan.describe(), 16 * ranks * plan.chunks_per_rank()));
  return plan;
}

double ring_attention_flops(const RingPlan& plan, int64_t rank, int64_t batch_heads, int64_t head_dim) {
  return 4.0 * static_cast<double>(head_dim) * static_cast<double>(batch_heads) * static_cast<double>(plan.work(rank));
}

void RingAttentionWorkspace::read_step_times() {
  steps.clear();
  for (size_t s = 0; s + 2 < timing.size(); s += 3) {
    timing[s + 2].synchronize();
    steps.push_back({runtime::Event::elapsed_ms(timing[s], timing[s + 2]), runtime::Event::elapsed_ms(timing[s], timing[s + 1])});
  }
}

void ring_attention_forward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                            const RingAttentionOptions& opt, RingAttentionWorkspace& ws) {
  runtime::current_device();
  int ranks = opt.local_ranks, rank = opt.local_rank;
  if (opt.local_only) {
    if (ranks < 1 || rank < 0 || rank >= ranks)
      throw Error(fmt::format("ring attention: local_only as rank {} of {} ranks", rank, ranks));
  } else {
    const RankOf r = rank_of(comm, "ring attention");
    rank = r.rank;
    ranks = r.ranks;
  }
  const RingPlan plan = ring_attention_plan(ranks, q, k, v, o, opt);
  const int64_t B = q.shape[0], H = q.shape[1], n = q.shape[2], D = q.shape[3], Hkv = k.shape[1], L = plan.chunk_rows();
  const CUstream stream = opt.stream;
  const SlotLayout layout(k, opt.fp8);
  for (auto& s : ws.slot) ensure_tensor(s, DType::e4m3, {layout.bytes});   // bytes
  const bool via_f16 = opt.f16_running_output && o.dtype == DType::bf16;
  if (via_f16) ensure_tensor(ws.running, DType::f16, {B, H, n, D});
  const TensorView out = via_f16 ? ws.running->view() : o;
  const TensorView lse = opt.lse ? *opt.lse : (ensure_tensor(ws.lse, DType::f32, {B, H, n}), ws.lse->view());
  if (!opt.fp8 && (!ws.ones || ws.ones->shape()[0] < B * H)) {
    HostTensor h(DType::f32, {B * H});
    for (int64_t i = 0; i < B * H; ++i) h.set(i, 1.0);
    ws.ones.emplace(DeviceTensor::from_host(h));
  }
  // The send / receive kernels run at the greatest priority: their blocks take the first SM that
  // an attention block leaves, instead of waiting behind the whole attention launch.
  if (!ws.comm) ws.comm.emplace(runtime::Stream::greatest_priority());
  const int64_t P = plan.ranks, steps = plan.steps();
  while (ws.sync.size() < static_cast<size_t>(2 * P + 1)) ws.sync.emplace_back(CU_EVENT_DISABLE_TIMING);
  ws.timing.clear();
  if (opt.record_steps)
    for (int64_t i = 0; i < 3 * steps; ++i) ws.timing.emplace_back(CU_EVENT_DEFAULT);
  auto mark = [&](int64_t step, int which) {
    if (opt.record_steps) ws.timing[3 * step + which].record(stream);
  };

  // Step 0's shard, this rank's own, into slot 0 (quantized in fp8), and Q's e4m3 copy.
  mark(0, 0);
  mark(0, 1);
  LaunchOptions lo;
  lo.stream = stream;
  TensorView qsrc = q, qd, ones_q, ones_kv;
  if (opt.fp8) {
    ensure_tensor(ws.q8, DType::e4m3, {B, H, n, D});
    ensure_tensor(ws.qd, DType::f32, {B, H});
    qsrc = ws.q8->view();
    qd = ws.qd->view();
    kernels::quantize_fp8_per_head(q, ws.partial, qsrc, qd, /*transpose=*/false, lo);
    kernels::quantize_fp8_per_head(k, ws.partial, layout.k(*ws.slot[0]), layout.kd(*ws.slot[0]), false, lo);
    kernels::quantize_fp8_per_head(v, ws.partial, slice(layout.v(*ws.slot[0]), 3, 0, n), layout.vd(*ws.slot[0]), true, lo);
  } else {
    copy_async(layout.k(*ws.slot[0]), k, stream);
    copy_async(layout.v(*ws.slot[0]), v, stream);
    ones_q = slice(ws.ones->view(), 0, 0, B * H);
    ones_q.shape = {B, H};
    ones_q.strides = {};
    ones_kv = ones_q;
    ones_kv.shape = {B, Hkv};
  }
  runtime::Event& ready = ws.sync[2 * P];
  const bool ring = !opt.local_only && P > 1;
  if (ring) {
    ready.record(stream);
    wait_event(ws.comm->get(), ready.get());
  }

  const DType in = opt.fp8 ? DType::e4m3 : q.dtype;
  const double scale = 1.4426950408889634 * opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  auto config_of = [&](const Kernel& kernel, bool causal, bool writes) {
    Config c = opt.attention_config ? *opt.attention_config
                                    : kernels::attention_variant_default_config(kernel.name(), in, D, causal, D, L, false);
    if (opt.fp8 && writes) c.knobs["attn_lse_e4m3_sums"] = 1;   // weigh the keys as the merging launches do
    return c;
  };
  std::vector<bool> written(plan.chunks_per_rank(), false);
  const int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  for (int64_t s = 0; s < steps; ++s) {
    const DeviceTensor& held = *ws.slot[ring ? s % 2 : 0];
    if (ring && s + 1 < steps) {
      // Pass the held shard on and take the next: into the slot that step s - 1 read.
      if (s >= 1) wait_event(ws.comm->get(), ws.sync[2 * (s - 1) + 1].get());
      nccl_check(ncclGroupStart(), "ring attention", "ncclGroupStart");
      nccl_check(ncclSend(held.view().data, layout.bytes, ncclUint8, next, comm, ws.comm->get()), "ring attention", "ncclSend");
      nccl_check(ncclRecv(ws.slot[(s + 1) % 2]->view().data, layout.bytes, ncclUint8, prev, comm, ws.comm->get()), "ring attention", "ncclRecv");
      nccl_check(ncclGroupEnd(), "ring attention", "ncclGroupEnd");
      ws.sync[2 * s].record(ws.comm->get());
    }
    if (s >= 1) {
      mark(s, 0);
      if (ring) wait_event(stream, ws.sync[2 * (s - 1)].get());
      mark(s, 1);
    }
    const TensorView hk = layout.k(held), hv = layout.v(held);
    const TensorView hkd = opt.fp8 ? layout.kd(held) : ones_kv, hvd = opt.fp8 ? layout.vd(held) : ones_kv;
    bool first_of_step = true;
    for (const RingPlan::Launch& l : plan.launches(rank, s)) {
      const bool writes = !written[l.q_chunk];
      const bool causal = l.mode == RingPlan::Mode::causal;
      const Kernel& kernel = kernels::ring_launch_kernel(plan, l, !writes);
      lo.config = config_of(kernel, causal || l.mode == RingPlan::Mode::window, writes);
      // A merging launch reads o and the LSE only after the previous launch ends; its main loop
      // reads the held shard, which no kernel on this stream writes (the first launch of a step
      // follows the wait for that shard, and starts in order).
      lo.start_early = !writes && !first_of_step;
      // The launch's rows: its query rows of the chunk and its keys of the held chunk.
      const int64_t q0 = l.q_chunk * L + l.q_begin, rows = l.q_end - l.q_begin;
      const int64_t k0 = l.kv_chunk * L + l.kv_begin, keys = l.kv_end - l.kv_begin;
      const TensorView kv_v = opt.fp8 ? slice(hv, 3, k0, keys) : slice(hv, 2, k0, keys);
      launch(kernel,
             {slice(qsrc, 2, q0, rows), slice(hk, 2, k0, keys), kv_v, opt.fp8 ? qd : ones_q, hkd, hvd, slice(out, 2, q0, rows),
              slice(lse, 2, q0, rows), scale, 1.0, causal, true},
             lo);
      written[l.q_chunk] = true;
      first_of_step = false;
    }
    ws.sync[2 * s + 1].record(stream);
    if (s + 1 == steps && via_f16) {
      LaunchOptions c;
      c.stream = stream;
      c.config = Config();
      c.config->blocks = {{"r", 64}, {"c", 64}};
      TensorView from = out, to = o;
      from.shape = to.shape = {1, 1, B * H * n, D};
      from.strides = to.strides = {};
      launch(kernels::convert(), {from, to}, c);
    }
    mark(s, 2);
  }
  for (bool w : written)
    if (!w) throw Error("ring attention: internal: a query chunk got no launch (" + plan.describe() + ")");
}

}  // namespace tj::dist
