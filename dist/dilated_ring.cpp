#include "dist/dilated_ring.h"

#include <fmt/format.h>

#include <algorithm>

#include "autotune/launch.h"
#include "core/error.h"
#include "dist/nccl_util.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"

namespace tj::dist {

using kernels::DilatedPair;

namespace {

// Heads j, j + r, ... and rows j, j + r, ... of [B, H, n, ...]: offset j's sparse positions.
TensorView sparse(const TensorView& t, int64_t j, int64_t r) { return every_of(every_of(t, 1, j, r), 2, j, r); }

// The segments of a spanning pair cover this many consecutive ranks.
int64_t group_of(const DilatedPair& p, int64_t n, int64_t ranks) { return std::min(p.segment / n, ranks); }

// The communicator of the groups of g consecutive ranks (this rank's group), split once.
ncclComm_t group_comm(ncclComm_t comm, int64_t g, int rank, int ranks, DilatedRingWorkspace& ws) {
  if (g == ranks) return comm;
  auto it = ws.groups.find(g);
  if (it != ws.groups.end()) return it->second;
  ncclComm_t c = nullptr;
  nccl_check(ncclCommSplit(comm, static_cast<int>(rank / g), rank, &c, nullptr), "dilated ring attention", "ncclCommSplit");
  ws.groups[g] = c;
  return c;
}

LaunchOptions simt_options(CUstream stream, std::map<std::string, int64_t> blocks) {
  LaunchOptions lo;
  lo.stream = stream;
  lo.config = Config();
  lo.config->blocks = std::move(blocks);
  return lo;
}

}  // namespace

DilatedRingWorkspace::~DilatedRingWorkspace() {
  for (auto& [g, c] : groups) ncclCommDestroy(c);
}

std::vector<bool> dilated_ring_spanning(int64_t ranks, const TensorView& q, const std::vector<DilatedPair>& pairs) {
  if (q.rank() != 4) throw Error(fmt::format("dilated ring attention: q is {}: expected [B, H, n, D]", q.describe()));
  const int64_t H = q.shape[1], n = q.shape[2];
  std::vector<bool> spanning;
  for (const auto& [w, r] : pairs) {
    if (w < 1 || r < 1 || w % r != 0 || H % r != 0 || n % r != 0)
      throw Error(fmt::format("dilated ring attention: pair (segment {}, rate {}): the rate must divide the segment length, "
                              "the number of heads ({}) and each rank's rows ({})",
                              w, r, H, n));
    if (n % w == 0) {
      spanning.push_back(false);
      continue;
    }
    const int64_t g = std::min(w / n, ranks);
    if (w % n != 0 || ranks % g != 0)
      throw Error(fmt::format("dilated ring attention: pair (segment {}, rate {}): a segment must lie in one rank's {} rows "
                              "(a divisor of {}) or span whole ranks' rows (a multiple of {} whose ranks divide the {} ranks)",
                              w, r, n, n, n, ranks));
    spanning.push_back(true);
  }
  return spanning;
}

void dilated_ring_attention_forward(ncclComm_t comm, const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& o, const DilatedRingOptions& opt, DilatedRingWorkspace& ws) {
  runtime::current_device();
  const auto [rank, ranks] = rank_of(comm, "dilated ring attention");
  if (opt.pairs.empty()) throw Error("dilated ring attention: no (segment, rate) pairs");
  if (k.shape != q.shape || v.shape != q.shape || o.shape != q.shape)
    throw Error(fmt::format("dilated ring attention: q, k, v and o must all be [B, H, n, D]; got q {} k {} v {} o {}",
                            q.describe(), k.describe(), v.describe(), o.describe()));
  const std::vector<bool> spanning = dilated_ring_spanning(ranks, q, opt.pairs);
  const int64_t B = q.shape[0], H = q.shape[1], n = q.shape[2], D = q.shape[3];

  // The local pairs write o and the running LSE (dilated attention on this rank's rows); without
  // any, o = 0 and LSE = -inf (no keys yet).
  kernels::DilatedOptions local;
  local.fp8 = opt.fp8;
  local.causal = opt.causal;
  local.stream = opt.stream;
  for (size_t p = 0; p < opt.pairs.size(); ++p)
    if (!spanning[p]) local.pairs.push_back(opt.pairs[p]);
  if (!local.pairs.empty()) {
    kernels::dilated_attention_forward(q, k, v, o, local, ws.local);
  } else {
    if (!ws.local.lse || ws.local.lse->shape() != std::vector<int64_t>{B, H, n}) ws.local.lse.emplace(DType::f32, std::vector<int64_t>{B, H, n});
    zero_async(o, opt.stream);
    runtime::Driver& d = runtime::driver();
    d.check(d.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(ws.local.lse->view().data), 0xFF800000u,
                               static_cast<size_t>(B * H * n), opt.stream),
            "cuMemsetD32Async");
  }
  const TensorView lse = ws.local.lse->view();

  // Each spanning pair: per head offset j, the ring over the segment's ranks on the sparse rows,
  // merged into o and the LSE.
  for (size_t p = 0; p < opt.pairs.size(); ++p) {
    if (!spanning[p]) continue;
    const int64_t r = opt.pairs[p].rate, g = group_of(opt.pairs[p], n, ranks);
    const ncclComm_t group = group_comm(comm, g, rank, ranks, ws);
    const std::vector<int64_t> shape = {B, H / r, n / r, D};
    ensure_tensor(ws.q, q.dtype, shape);
    ensure_tensor(ws.k, q.dtype, shape);
    ensure_tensor(ws.v, q.dtype, shape);
    ensure_tensor(ws.o, q.dtype, shape);
    ensure_tensor(ws.lse, DType::f32, {B, H / r, n / r});
    RingAttentionOptions ro;
    ro.sharding = kernels::RingPlan::Sharding::contiguous;
    ro.causal = opt.causal;
    ro.fp8 = opt.fp8;
    ro.lse = ws.lse->view();
    ro.stream = opt.stream;
    const LaunchOptions gather = simt_options(opt.stream, {{"r", 64}, {"c", 64}});
    const LaunchOptions merge = simt_options(opt.stream, {{"s", 64}});
    for (int64_t j = 0; j < r; ++j) {
      launch(kernels::convert(), {sparse(q, j, r), ws.q->view()}, gather);
      launch(kernels::convert(), {sparse(k, j, r), ws.k->view()}, gather);
      launch(kernels::convert(), {sparse(v, j, r), ws.v->view()}, gather);
      ring_attention_forward(group, ws.q->view(), ws.k->view(), ws.v->view(), ws.o->view(), ro, ws.ring);
      launch(kernels::merge_attention(), {sparse(o, j, r), sparse(lse, j, r), ws.o->view(), ws.lse->view()}, merge);
    }
  }
}

}  // namespace tj::dist
