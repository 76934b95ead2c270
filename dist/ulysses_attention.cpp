#include "dist/ulysses_attention.h"

#include <fmt/format.h>

#include "core/error.h"
#include "dist/nccl_util.h"
#include "dist/ring_attention.h"
#include "runtime/device.h"

namespace tj::dist {

using kernels::RingPlan;

namespace {

// The address of row `row` of head `h` of batch entry `b` in a contiguous [B, heads, rows, D].
void* at(const TensorView& t, int64_t b, int64_t h, int64_t row) {
  const int64_t heads = t.shape[1], rows = t.shape[2], D = t.shape[3];
  return static_cast<char*>(t.data) + (((b * heads + h) * rows + row) * D) * size_bytes(t.dtype);
}

// One all-to-all of `local` [B, heads, n, D] (this rank's rows of every head) and `gathered` [B,
// heads / P, S, D] (every row of this rank's heads): scatter sends each (head, chunk) block of
// local to the head's rank, which receives it at the chunk's rows; gather the other way.
void all_to_all(ncclComm_t comm, const RingPlan& plan, int rank, const TensorView& local, const TensorView& gathered,
                bool scatter, CUstream stream) {
  const int64_t B = local.shape[0], heads = local.shape[1], per_rank = heads / plan.ranks, D = local.shape[3];
  const int64_t L = plan.chunk_rows();
  const size_t bytes = static_cast<size_t>(L * D) * size_bytes(local.dtype);
  nccl_check(ncclGroupStart(), "ulysses attention", "ncclGroupStart");
  for (int64_t peer = 0; peer < plan.ranks; ++peer)
    for (int64_t b = 0; b < B; ++b)
      for (int c = 0; c < plan.chunks_per_rank(); ++c) {
        // Blocks of this rank's rows, head by head, to / from the heads' ranks.
        for (int64_t j = 0; j < per_rank; ++j) {
          void* mine = at(local, b, peer * per_rank + j, c * L);
          scatter ? nccl_check(ncclSend(mine, bytes, ncclUint8, static_cast<int>(peer), comm, stream), "ulysses attention", "ncclSend")
                  : nccl_check(ncclRecv(mine, bytes, ncclUint8, static_cast<int>(peer), comm, stream), "ulysses attention", "ncclRecv");
        }
        // Blocks of this rank's heads, at the rows of the peer's chunk c.
        for (int64_t j = 0; j < per_rank; ++j) {
          void* theirs = at(gathered, b, j, plan.chunk_of(peer, c) * L);
          scatter ? nccl_check(ncclRecv(theirs, bytes, ncclUint8, static_cast<int>(peer), comm, stream), "ulysses attention", "ncclRecv")
                  : nccl_check(ncclSend(theirs, bytes, ncclUint8, static_cast<int>(peer), comm, stream), "ulysses attention", "ncclSend");
        }
      }
  nccl_check(ncclGroupEnd(), "ulysses attention", "ncclGroupEnd");
}

}  // namespace

RingPlan ulysses_attention_plan(int64_t ranks, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                const UlyssesAttentionOptions& opt) {
  RingAttentionOptions ro;   // the same tensors as the ring takes
  ro.sharding = opt.sharding;
  ro.causal = opt.causal;
  RingPlan plan = [&] {
    try {
      return ring_attention_plan(ranks, q, k, v, o, ro);
    } catch (const Error& e) {
      throw Error(std::string("ulysses attention: ") + (std::string(e.what()).rfind("ring attention: ", 0) == 0
                                                             ? std::string(e.what()).substr(16)
                                                             : std::string(e.what())));
    }
  }();
  if (q.shape[1] % ranks != 0 || k.shape[1] % ranks != 0)
    throw Error(fmt::format("ulysses attention: {} query heads and {} K / V heads must both split over {} ranks (each rank "
                            "computes whole heads); the ring (ring_attention_forward) takes any head count",
                            q.shape[1], k.shape[1], ranks));
  return plan;
}

void ulysses_attention_forward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& o, const UlyssesAttentionOptions& opt, UlyssesAttentionWorkspace& ws) {
  runtime::current_device();
  const auto [rank, ranks] = rank_of(comm, "ulysses attention");
  const RingPlan plan = ulysses_attention_plan(ranks, q, k, v, o, opt);
  const int64_t B = q.shape[0], H = q.shape[1], Hkv = k.shape[1], D = q.shape[3], S = plan.seq;
  ensure_tensor(ws.q, q.dtype, {B, H / ranks, S, D});
  ensure_tensor(ws.k, q.dtype, {B, Hkv / ranks, S, D});
  ensure_tensor(ws.v, q.dtype, {B, Hkv / ranks, S, D});
  ensure_tensor(ws.o, q.dtype, {B, H / ranks, S, D});
  all_to_all(comm, plan, rank, q, ws.q->view(), true, opt.stream);
  all_to_all(comm, plan, rank, k, ws.k->view(), true, opt.stream);
  all_to_all(comm, plan, rank, v, ws.v->view(), true, opt.stream);
  kernels::AttentionFp8Options a;
  a.causal = opt.causal;
  a.quantize = opt.fp8;
  a.softmax_scale = opt.softmax_scale;
  a.attention_config = opt.attention_config;
  a.stream = opt.stream;
  kernels::attention_fp8_forward(ws.q->view(), ws.k->view(), ws.v->view(), ws.o->view(), a, ws.attention);
  all_to_all(comm, plan, rank, o, ws.o->view(), false, opt.stream);
}

}  // namespace tj::dist
