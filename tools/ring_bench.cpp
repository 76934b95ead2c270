#include "tools/ring_bench.h"

#include <fmt/format.h>
#include <nccl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "dist/dilated_ring.h"
#include "dist/ring_attention.h"
#include "dist/ring_backward.h"
#include "kernels/attention_backward.h"
#include "dist/ulysses_attention.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variants.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "tools/attention.h"
#include "tools/attention_grads.h"

extern char** environ;

namespace tj::tools {

using kernels::RingPlan;

std::string hex_of(const void* bytes, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", static_cast<const unsigned char*>(bytes)[i]);
  return s;
}

void bytes_of_hex(const std::string& hex, void* bytes, size_t n) {
  if (hex.size() != 2 * n || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw Error(fmt::format("--nccl-id: expected {} hex digits, got '{}'", 2 * n, hex.substr(0, 16)));
  for (size_t i = 0; i < n; ++i) static_cast<unsigned char*>(bytes)[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
}

namespace {

void nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(fmt::format("{}: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(nullptr)));
}

}  // namespace

int ring_launch(const RingBenchOptions& opt, const std::vector<std::string>& argv) {
  resolved(opt);   // the options' errors once, before any rank starts
  int gpus = opt.gpus;
  if (gpus <= 0) {
    runtime::Driver& d = runtime::driver();
    d.require_available();
    gpus = d.device_count();
  }
  ncclUniqueId id;
  nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const std::string hex = hex_of(&id, sizeof id);
  std::vector<pid_t> pids;
  for (int r = 0; r < gpus; ++r) {
    std::vector<std::string> args = argv;
    for (const std::string& a : {std::string("--rank"), std::to_string(r), std::string("--gpus"), std::to_string(gpus),
                                 std::string("--nccl-id"), hex})
      args.push_back(a);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "TILEJIT_DEVICE=", 15) != 0) env.emplace_back(*e);
    env.push_back(fmt::format("TILEJIT_DEVICE={}", r));
    // NVLink multicast stays off (a program that uses it can take the host's GPUs out of service).
    if (!std::getenv("NCCL_NVLS_ENABLE")) env.emplace_back("NCCL_NVLS_ENABLE=0");
    std::vector<char*> cargs, cenv;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    pid_t pid = 0;
    if (int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), cenv.data()); rc != 0)
      throw Error(fmt::format("cannot start rank {}: {}", r, std::strerror(rc)));
    pids.push_back(pid);
  }
  int failed = 0;
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
      std::cerr << fmt::format("tilejit-ring: rank {} {}\n", r,
                               WIFEXITED(status) ? fmt::format("exited with {}", WEXITSTATUS(status))
                                                 : fmt::format("died of signal {}", WTERMSIG(status)));
    }
  }
  return failed ? 1 : 0;
}

namespace {

struct Case {
  int64_t S = 0;
  bool fp8 = false, causal = false;
  bool ulysses = false;   // all-to-all (dist/ulysses_attention.h) instead of the ring
};

void synchronize(CUstream stream) { runtime::driver().check(runtime::driver().cuStreamSynchronize(stream), "cuStreamSynchronize"); }

// Fills t with copies of a block of standard normal values (seeded): timing inputs, random
// enough that the softmax is not degenerate, without drawing a billion normals on the host.
void fill_random(const DeviceTensor& t, uint64_t seed, CUstream stream) {
  const int64_t n = t.view().numel(), block = std::min<int64_t>(n, int64_t{1} << 22);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  HostTensor h(t.dtype(), {block});
  for (int64_t i = 0; i < block; ++i) h.set(i, nd(rng));
  DeviceTensor d = DeviceTensor::from_host(h);
  runtime::Driver& drv = runtime::driver();
  const size_t eb = size_bytes(t.dtype());
  for (int64_t at = 0; at < n; at += block)
    drv.check(drv.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(t.view().data) + at * eb,
                                    reinterpret_cast<CUdeviceptr>(d.view().data), std::min(block, n - at) * eb, stream),
              "cuMemcpyDtoDAsync");
  synchronize(stream);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times calls on the compute stream with CUDA events, after an all-reduce has lined the ranks up
// (no rank's time counts another's late start).
class AlignedTimer {
 public:
  AlignedTimer(ncclComm_t comm, CUstream stream) : comm_(comm), stream_(stream), token_(sizeof(float)) { token_.memset(0); }
  template <class Fn>
  double ms(Fn&& fn) {
    void* t = reinterpret_cast<void*>(token_.ptr());
    nccl(ncclAllReduce(t, t, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    t0_.record(stream_);
    fn();
    t1_.record(stream_);
    t1_.synchronize();
    return double{runtime::Event::elapsed_ms(t0_, t1_)};
  }
  // The medians of `a` and `b` over reps calls each after warmup, alternating, so that both see
  // the same clocks and temperature.
  template <class A, class B>
  std::pair<double, double> alternate(int warmup, int reps, A&& a, B&& b) {
    std::vector<double> ta, tb;
    for (int i = 0; i < warmup + reps; ++i) {
      const double x = ms(a), y = ms(b);
      if (i >= warmup) {
        ta.push_back(x);
        tb.push_back(y);
      }
    }
    return {median(ta), median(tb)};
  }

 private:
  ncclComm_t comm_;
  CUstream stream_;
  runtime::DeviceBuffer token_;
  runtime::Event t0_, t1_;
};

// Gathers `mine` (the same count on every rank) from every rank, rank-major.
std::vector<double> all_gather(ncclComm_t comm, const std::vector<double>& mine, int ranks, CUstream stream) {
  const size_t n = mine.size();
  runtime::DeviceBuffer send(n * sizeof(double)), recv(n * ranks * sizeof(double));
  send.copy_from_host(mine.data(), n * sizeof(double));
  nccl(ncclAllGather(reinterpret_cast<void*>(send.ptr()), reinterpret_cast<void*>(recv.ptr()), n, ncclFloat64, comm, stream),
       "ncclAllGather");
  synchronize(stream);
  std::vector<double> out(n * ranks);
  recv.copy_to_host(out.data(), out.size() * sizeof(double));
  return out;
}

struct Shards {
  DeviceTensor q, k, v, o;
};

Shards make_shards(int64_t B, int64_t H, int64_t Hkv, int64_t n, int64_t D) {
  return {DeviceTensor(DType::bf16, {B, H, n, D}), DeviceTensor(DType::bf16, {B, Hkv, n, D}),
          DeviceTensor(DType::bf16, {B, Hkv, n, D}), DeviceTensor(DType::bf16, {B, H, n, D})};
}

// Random N(0, 1) bf16 values: with the same seed, the same tensors on every rank.
HostTensor random_bf16(std::vector<int64_t> shape, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  HostTensor t(DType::bf16, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, nd(rng));
  return t;
}

// This rank's rows of `ours` [.., n, D] and the same rows of `whole` [.., S, D] (local row i is
// global row row_of(i)), every head, flattened alike.
void paired_rows(const HostTensor& ours, const HostTensor& whole, int64_t heads, int64_t n, int64_t S, int64_t D,
                 const std::function<int64_t(int64_t)>& row_of, std::vector<double>& got, std::vector<double>& want) {
  for (int64_t bh = 0; bh < heads; ++bh)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < D; ++x) {
        got.push_back(ours.at((bh * n + i) * D + x));
        want.push_back(whole.at((bh * S + row_of(i)) * D + x));
      }
}

// Rank r's rows (the plan's chunks, one after another) of a [B, H, S, ...] host tensor.
HostTensor rank_rows(const HostTensor& t, const RingPlan& plan, int64_t rank) {
  std::vector<int64_t> shape = t.shape();
  const int64_t S = shape[2], n = S / plan.ranks, BH = shape[0] * shape[1];
  const int64_t row_bytes = (shape.size() > 3 ? shape[3] : 1) * size_bytes(t.dtype());
  shape[2] = n;
  HostTensor s(t.dtype(), shape);
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(s.data()) + (bh * n + i) * row_bytes,
                  static_cast<const char*>(t.data()) + (bh * S + plan.global_row(rank, i)) * row_bytes, row_bytes);
  return s;
}

dist::RingAttentionOptions ring_options(const Case& c, const RingPlan& plan, CUstream stream) {
  dist::RingAttentionOptions ro;
  ro.causal = c.causal;
  ro.window = plan.window;
  ro.fp8 = c.fp8;
  ro.sharding = plan.sharding;
  ro.stream = stream;
  return ro;
}

std::string mask_name(const RingPlan& plan) {
  return plan.window > 0 ? fmt::format("window {}", plan.window) : plan.causal ? "causal" : "full";
}

dist::UlyssesAttentionOptions ulysses_options(const dist::RingAttentionOptions& r) {
  dist::UlyssesAttentionOptions u;
  u.sharding = r.sharding;
  u.causal = r.causal;
  u.fp8 = r.fp8;
  u.stream = r.stream;
  return u;
}

// --check: the ring's rows against single-GPU attention of the whole sequence (every rank runs it
// on its own GPU) and against float64 on sampled rows. Returns whether this rank passed.
bool check_case(ncclComm_t comm, int rank, int ranks, const RingBenchOptions& opt, const Case& c, const RingPlan& plan,
                CUstream stream, std::ostream& log) {
  const int64_t B = opt.batch, H = opt.heads, Hkv = opt.kv_heads, D = opt.head_dim, S = c.S, n = S / ranks;
  std::mt19937 rng(1234);
  const HostTensor q = random_bf16({B, H, S, D}, rng), k = random_bf16({B, Hkv, S, D}, rng), v = random_bf16({B, Hkv, S, D}, rng);
  // This rank's rows, one after another.
  auto shard = [&](const HostTensor& t) { return rank_rows(t, plan, rank); };
  DeviceTensor dq = DeviceTensor::from_host(shard(q)), dk = DeviceTensor::from_host(shard(k)), dv = DeviceTensor::from_host(shard(v));
  DeviceTensor o(DType::bf16, {B, H, n, D});
  o.fill_bytes(0xFF);
  dist::RingAttentionOptions ro = ring_options(c, plan, stream);
  dist::RingAttentionWorkspace ws;
  dist::UlyssesAttentionWorkspace uws;
  if (c.ulysses) dist::ulysses_attention_forward(comm, dq.view(), dk.view(), dv.view(), o.view(), ulysses_options(ro), uws);
  else dist::ring_attention_forward(comm, dq.view(), dk.view(), dv.view(), o.view(), ro, ws);
  // Single-GPU attention of the whole sequence (the same recipe: fp8 quantizes per (b, h)).
  DeviceTensor fq = DeviceTensor::from_host(q), fk = DeviceTensor::from_host(k), fv = DeviceTensor::from_host(v);
  DeviceTensor fo(DType::bf16, {B, H, S, D});
  kernels::AttentionFp8Options ao;
  ao.causal = c.causal;
  ao.quantize = c.fp8;
  ao.stream = stream;
  const Kernel window_kernel = kernels::attention_variant(kernels::sliding_window_variant(std::max<int64_t>(1, plan.window)));
  if (plan.window > 0) ao.kernel = &window_kernel;
  kernels::AttentionFp8Workspace aws;
  kernels::attention_fp8_forward(fq.view(), fk.view(), fv.view(), fo.view(), ao, aws);
  synchronize(stream);
  const HostTensor ho = o.to_host(), hfo = fo.to_host();
  std::vector<double> ring_all, single_all;
  paired_rows(ho, hfo, B * H, n, S, D, [&](int64_t i) { return plan.global_row(rank, i); }, ring_all, single_all);
  // float64 on sampled rows: 8 rows of this rank spread over its chunks, every head.
  std::vector<double> want, ring_s, single_s;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < 8; ++t) {
        const int64_t i = (t * n) / 8 + (t * 37) % (n / 8), row = plan.global_row(rank, i), hk = h / (H / Hkv);
        const int64_t last = c.causal ? row : S - 1, first = plan.window > 0 ? std::max<int64_t>(0, row - plan.window + 1) : 0;
        std::vector<double> p(last + 1, 0.0);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = first; j <= last; ++j) {
          double d = 0;
          for (int64_t x = 0; x < D; ++x) d += q.at(((b * H + h) * S + row) * D + x) * k.at(((b * Hkv + hk) * S + j) * D + x);
          mx = std::max(mx, p[j] = d * scale);
        }
        for (int64_t j = first; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t x = 0; x < D; ++x) {
          double acc = 0;
          for (int64_t j = first; j <= last; ++j) acc += p[j] * v.at(((b * Hkv + hk) * S + j) * D + x);
          want.push_back(acc / sum);
          ring_s.push_back(ho.at(((b * H + h) * n + i) * D + x));
          single_s.push_back(hfo.at(((b * H + h) * S + row) * D + x));
        }
      }
  const double vs_single = relative_rmse(ring_all, single_all), ring_err = relative_rmse(ring_s, want),
               single_err = relative_rmse(single_s, want);
  // bf16: the bound against float64; fp8: within the single-GPU FP8 error (each rank's
  // shards have descales of their own, so the two differ a little).
  const bool ok = c.fp8 ? ring_err <= 1.2 * single_err + 2e-3 : ring_err <= 3e-3;
  const std::vector<double> all = all_gather(comm, {vs_single, ring_err, single_err, ok ? 1.0 : 0.0}, ranks, stream);
  bool all_ok = true;
  if (rank == 0)
    for (int r = 0; r < ranks; ++r) {
      const double* m = &all[4 * r];
      all_ok = all_ok && m[3] == 1.0;
      log << fmt::format("| {} | {} | {} | {} | {} | {} | {:.2e} | {:.2e} | {:.2e} | {} |\n", S, ranks, c.ulysses ? "all-to-all" : "ring",
                         c.fp8 ? "fp8" : "bf16", mask_name(plan), r, m[0], m[1], m[2], m[3] == 1.0 ? "ok" : "**FAIL**");
    }
  return ok && (rank != 0 || all_ok);
}

// --check --backward: the ring's gradients of this rank's rows (dist/ring_backward.h, from the
// forward's o and LSE of one GPU) against attention_backward of the whole sequence on one GPU.
bool check_backward(ncclComm_t comm, int rank, int ranks, const RingBenchOptions& opt, int64_t S, bool causal,
                    RingPlan::Sharding sharding, CUstream stream, std::ostream& log) {
  const int64_t B = opt.batch, H = opt.heads, Hkv = opt.kv_heads, D = opt.head_dim;
  const RingPlan plan(ranks, S, causal && !opt.window ? sharding : RingPlan::Sharding::contiguous, causal, opt.window);
  std::mt19937 rng(2024);
  const std::vector<int64_t> shape = {B, H, S, D}, kv_shape = {B, Hkv, S, D};
  const HostTensor q = random_bf16(shape, rng), k = random_bf16(kv_shape, rng), v = random_bf16(kv_shape, rng),
                   dout = random_bf16(shape, rng);
  const DeviceTensor fq = DeviceTensor::from_host(q), fk = DeviceTensor::from_host(k), fv = DeviceTensor::from_host(v),
                     fdo = DeviceTensor::from_host(dout);
  DeviceTensor fo(DType::bf16, shape), flse(DType::f32, {B, H, S});
  std::vector<DeviceTensor> want;   // dq, dk, dv
  for (int i = 0; i < 3; ++i) want.emplace_back(DType::bf16, i == 0 ? shape : kv_shape);
  // A window: one GPU runs the sliding-window variant's forward and backward over the whole sequence.
  const kernels::AttentionVariant window = kernels::sliding_window_variant(std::max<int64_t>(1, plan.window));
  const Kernel window_forward = kernels::attention_variant(window);
  const kernels::VariantBackward window_backward = kernels::attention_variant_backward(window);
  kernels::AttentionFp8Options fwd;
  fwd.quantize = false;
  fwd.causal = causal;
  fwd.lse = flse.view();
  fwd.stream = stream;
  if (plan.window > 0) fwd.kernel = &window_forward;
  kernels::AttentionFp8Workspace fws;
  kernels::attention_fp8_forward(fq.view(), fk.view(), fv.view(), fo.view(), fwd, fws);
  kernels::AttentionBackwardOptions bo;
  bo.causal = causal;
  bo.stream = stream;
  if (plan.window > 0) bo.variant = &window_backward;
  kernels::AttentionBackwardWorkspace bws;
  kernels::attention_backward(fq.view(), fk.view(), fv.view(), fo.view(), fdo.view(), flse.view(), want[0].view(), want[1].view(),
                              want[2].view(), bo, bws);
  synchronize(stream);
  const HostTensor ho = fo.to_host(), hl = flse.to_host();
  auto mine = [&](const HostTensor& t) { return DeviceTensor::from_host(rank_rows(t, plan, rank)); };
  const DeviceTensor rq = mine(q), rk = mine(k), rv = mine(v), rdo = mine(dout), ro = mine(ho), rl = mine(hl);
  const int64_t n = S / ranks;
  std::vector<DeviceTensor> got;
  for (int i = 0; i < 3; ++i) {
    got.emplace_back(DType::bf16, std::vector<int64_t>{B, i == 0 ? H : Hkv, n, D});
    got.back().fill_bytes(0xFF);
  }
  dist::RingBackwardOptions rbo;
  rbo.sharding = plan.sharding;
  rbo.causal = causal;
  rbo.window = plan.window;
  rbo.stream = stream;
  dist::RingBackwardWorkspace rws;
  dist::ring_attention_backward(comm, rq.view(), rk.view(), rv.view(), ro.view(), rdo.view(), rl.view(), got[0].view(),
                                got[1].view(), got[2].view(), rbo, rws);
  synchronize(stream);
  std::vector<double> errs;
  for (int i = 0; i < 3; ++i) {
    std::vector<double> a, b;
    paired_rows(got[i].to_host(), want[i].to_host(), B * (i == 0 ? H : Hkv), n, S, D, [&](int64_t r) { return plan.global_row(rank, r); },
                a, b);
    errs.push_back(relative_rmse(a, b));
  }
  // Both sum dQ in f32 in another order (the ring by atomic adds) and round each gradient to bf16.
  const bool ok = *std::max_element(errs.begin(), errs.end()) <= 1e-2;
  const std::vector<double> all = all_gather(comm, {errs[0], errs[1], errs[2], ok ? 1.0 : 0.0}, ranks, stream);
  bool all_ok = true;
  if (rank == 0)
    for (int r = 0; r < ranks; ++r) {
      all_ok = all_ok && all[4 * r + 3] == 1.0;
      log << fmt::format("| {} | {} | ring backward | bf16 | {} | {} | dq {:.2e}, dk {:.2e}, dv {:.2e} | - | - | {} |\n", S, ranks,
                         mask_name(plan), r, all[4 * r], all[4 * r + 1], all[4 * r + 2], all[4 * r + 3] == 1.0 ? "ok" : "**FAIL**");
    }
  return ok && (rank != 0 || all_ok);
}

// --backward without --check: the ring backward timed against its own launches on one GPU
// (local_only), after a ring forward gave o and the LSE; TFLOP/s count 2.5 forwards (five matrix
// products against two).
void time_backward(ncclComm_t comm, int rank, int ranks, const RingBenchOptions& opt, int64_t S, bool causal,
                   RingPlan::Sharding sharding, CUstream stream, std::ostream& log) {
  const int64_t B = opt.batch, H = opt.heads, Hkv = opt.kv_heads, D = opt.head_dim, n = S / ranks;
  const RingPlan plan(ranks, S, causal && !opt.window ? sharding : RingPlan::Sharding::contiguous, causal, opt.window);
  const std::vector<int64_t> shape = {B, H, n, D}, kv_shape = {B, Hkv, n, D};
  std::vector<DeviceTensor> t;   // q, k, v, do, o, dq, dk, dv
  for (int i = 0; i < 8; ++i) t.emplace_back(DType::bf16, i == 1 || i == 2 || i == 6 || i == 7 ? kv_shape : shape);
  for (int i = 0; i < 4; ++i) fill_random(t[i], 101 + 13 * i + rank, stream);
  DeviceTensor lse(DType::f32, {B, H, n});
  dist::RingAttentionOptions fo;
  fo.sharding = plan.sharding;
  fo.causal = causal;
  fo.window = plan.window;
  fo.lse = lse.view();
  fo.stream = stream;
  dist::RingAttentionWorkspace fws;
  dist::ring_attention_forward(comm, t[0].view(), t[1].view(), t[2].view(), t[4].view(), fo, fws);
  dist::RingBackwardOptions ring;
  ring.sharding = plan.sharding;
  ring.causal = causal;
  ring.window = plan.window;
  ring.stream = stream;
  dist::RingBackwardOptions local = ring;
  local.local_only = true;
  local.local_ranks = ranks;
  local.local_rank = rank;
  dist::RingBackwardWorkspace rws, lws;
  auto call = [&](const dist::RingBackwardOptions& opts, dist::RingBackwardWorkspace& work) {
    return [&, o = &opts, w = &work] {
      dist::ring_attention_backward(o->local_only ? nullptr : comm, t[0].view(), t[1].view(), t[2].view(), t[4].view(), t[3].view(),
                                    lse.view(), t[5].view(), t[6].view(), t[7].view(), *o, *w);
    };
  };
  AlignedTimer timer(comm, stream);
  const auto [ring_ms, local_ms] = timer.alternate(opt.warmup, opt.reps, call(ring, rws), call(local, lws));
  const std::vector<double> all = all_gather(comm, {ring_ms, local_ms}, ranks, stream);
  if (rank != 0) return;
  double ring_max = 0, local_max = 0;
  for (int r = 0; r < ranks; ++r) {
    ring_max = std::max(ring_max, all[2 * r]);
    local_max = std::max(local_max, all[2 * r + 1]);
  }
  double per_gpu = 2.5 * attention_flops(B, H, S, D, causal) / ranks;   // a window: the scores it keeps
  if (plan.window > 0) {
    per_gpu = 0;
    for (int r = 0; r < ranks; ++r) per_gpu += 2.5 * dist::ring_attention_flops(plan, r, B * H, D) / ranks;
  }
  const double ring_tf = per_gpu / ring_max * 1e-9, local_tf = per_gpu / local_max * 1e-9;
  log << fmt::format("| {} | {} | ring backward | bf16 | {} | {} | {:.1f} | {:.1f} | {:.1f} | - | {:.3f} | - | - | - |\n", S, ranks,
                     mask_name(plan), plan.sharding == RingPlan::Sharding::zigzag ? "zigzag" : "contiguous", ring_max, ring_tf,
                     local_tf, ring_tf / local_tf);
}

// --check --dilated: dilated attention over the ranks (dist/dilated_ring.h) against single-GPU
// dilated attention of the whole sequence (every rank runs it on its own GPU).
bool check_dilated(ncclComm_t comm, int rank, int ranks, const RingBenchOptions& opt, const std::vector<kernels::DilatedPair>& pairs,
                   int64_t S, bool fp8, bool causal, CUstream stream, std::ostream& log) {
  const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim, n = S / ranks;
  std::mt19937 rng(4321);
  const HostTensor q = random_bf16({B, H, S, D}, rng), k = random_bf16({B, H, S, D}, rng), v = random_bf16({B, H, S, D}, rng);
  const DeviceTensor fq = DeviceTensor::from_host(q), fk = DeviceTensor::from_host(k), fv = DeviceTensor::from_host(v);
  DeviceTensor fo(DType::bf16, {B, H, S, D}), o(DType::bf16, {B, H, n, D});
  o.fill_bytes(0xFF);
  // This rank's rows [rank·n, (rank + 1)·n): contiguous copies of the whole tensors' rows.
  auto rows = [&](const DeviceTensor& t) {
    DeviceTensor s(DType::bf16, {B, H, n, D});
    LaunchOptions lo;
    lo.stream = stream;
    lo.config = Config();
    lo.config->blocks = {{"r", 64}, {"c", 64}};
    launch(kernels::convert(), {slice_of(t.view(), 2, rank * n, n), s.view()}, lo);
    return s;
  };
  const DeviceTensor dq = rows(fq), dk = rows(fk), dv = rows(fv);
  dist::DilatedRingOptions dro;
  dro.pairs = pairs;
  dro.causal = causal;
  dro.fp8 = fp8;
  dro.stream = stream;
  dist::DilatedRingWorkspace ws;
  dist::dilated_ring_attention_forward(comm, dq.view(), dk.view(), dv.view(), o.view(), dro, ws);
  kernels::DilatedOptions one;
  one.pairs = pairs;
  one.causal = causal;
  one.fp8 = fp8;
  one.stream = stream;
  kernels::DilatedWorkspace ows;
  kernels::dilated_attention_forward(fq.view(), fk.view(), fv.view(), fo.view(), one, ows);
  synchronize(stream);
  const HostTensor ho = o.to_host(), hfo = fo.to_host();
  std::vector<double> got, want;
  paired_rows(ho, hfo, B * H, n, S, D, [&](int64_t i) { return rank * n + i; }, got, want);
  const double err = relative_rmse(got, want);
  // bf16: the two round differently (merges, the ring's f16 running O); fp8: each quantizes its
  // own views (the local pairs per shard, the ring per rank's sparse rows).
  const bool ok = err <= (fp8 ? 1.2e-1 : 6e-3);
  const std::vector<double> all = all_gather(comm, {err, ok ? 1.0 : 0.0}, ranks, stream);
  bool all_ok = true;
  std::string spec;
  for (const auto& [w, r] : pairs) spec += fmt::format("{}{}:{}", spec.empty() ? "" : ",", w, r);
  if (rank == 0)
    for (int r = 0; r < ranks; ++r) {
      all_ok = all_ok && all[2 * r + 1] == 1.0;
      log << fmt::format("| {} | {} | dilated {} | {} | {} | {} | {:.2e} | - | - | {} |\n", S, ranks, spec, fp8 ? "fp8" : "bf16",
                         causal ? "causal" : "full", r, all[2 * r], all[2 * r + 1] == 1.0 ? "ok" : "**FAIL**");
    }
  return ok && (rank != 0 || all_ok);
}

// Times ring_attention_forward on this case and its single-GPU baselines; rank 0 prints a row.
void time_case(ncclComm_t comm, int rank, int ranks, const RingBenchOptions& opt, const Case& c, const RingPlan& plan,
               CUstream stream, std::ostream& log) {
  const int64_t B = opt.batch, H = opt.heads, Hkv = opt.kv_heads, D = opt.head_dim, S = c.S, n = S / ranks;
  Shards sh = make_shards(B, H, Hkv, n, D);
  fill_random(sh.q, 11 + rank, stream);
  fill_random(sh.k, 23 + rank, stream);
  fill_random(sh.v, 37 + rank, stream);
  dist::RingAttentionOptions ro = ring_options(c, plan, stream);
  dist::RingAttentionWorkspace ws;
  dist::RingAttentionOptions local = ro;
  local.local_only = true;
  local.local_ranks = ranks;
  local.local_rank = rank;
  dist::RingAttentionWorkspace local_ws;
  dist::UlyssesAttentionWorkspace uws;
  kernels::AttentionFp8Workspace local_aws;
  auto call = [&](const dist::RingAttentionOptions& opts, dist::RingAttentionWorkspace& work) {
    return [&, po = &opts, w = &work] {
      const dist::RingAttentionOptions& o = *po;
      if (c.ulysses && !o.local_only) {
        dist::ulysses_attention_forward(comm, sh.q.view(), sh.k.view(), sh.v.view(), sh.o.view(), ulysses_options(o), uws);
      } else if (c.ulysses) {
        // All-to-all's attention alone: the gathered heads of the last call, without the transfers.
        kernels::AttentionFp8Options a;
        a.causal = o.causal;
        a.quantize = o.fp8;
        a.stream = stream;
        kernels::attention_fp8_forward(uws.q->view(), uws.k->view(), uws.v->view(), uws.o->view(), a, local_aws);
      } else {
        dist::ring_attention_forward(o.local_only ? nullptr : comm, sh.q.view(), sh.k.view(), sh.v.view(), sh.o.view(), o, *w);
      }
    };
  };
  AlignedTimer timer(comm, stream);
  const auto [ring_ms, local_ms] = timer.alternate(opt.warmup, opt.reps, call(ro, ws), call(local, local_ws));
  ro.record_steps = !c.ulysses;
  timer.ms(call(ro, ws));
  if (!c.ulysses) ws.read_step_times();
  double wait_ms = 0, worst_step_wait = 0;
  for (size_t s = 1; !c.ulysses && s < ws.steps.size(); ++s) {
    wait_ms += ws.steps[s].wait_ms;
    worst_step_wait = std::max(worst_step_wait, double{ws.steps[s].wait_ms} / std::max(1e-9, double{ws.steps[s].step_ms}));
  }
  // Non-causal: one dense launch of this rank's rows over S keys (the kernel's own rate there).
  double dense_ms = 0;
  const bool dense = !c.causal && !plan.window;
  if (dense) {
    DeviceTensor k_all(DType::bf16, {B, Hkv, S, D}), v_all(DType::bf16, {B, Hkv, S, D});
    fill_random(k_all, 5, stream);
    fill_random(v_all, 7, stream);
    kernels::AttentionFp8Options ao;
    ao.quantize = c.fp8;
    ao.stream = stream;
    kernels::AttentionFp8Workspace aws;
    std::vector<double> ms;
    for (int i = 0; i < opt.warmup + opt.reps; ++i) {
      const double t = timer.ms([&] { kernels::attention_fp8_forward(sh.q.view(), k_all.view(), v_all.view(), sh.o.view(), ao, aws); });
      if (i >= opt.warmup) ms.push_back(t);
    }
    dense_ms = median(ms);
  }
  const std::vector<double> all = all_gather(comm, {ring_ms, local_ms, dense_ms, wait_ms, worst_step_wait}, ranks, stream);
  if (rank != 0) return;
  double ring_max = 0, local_max = 0, dense_max = 0, wait_max = 0, worst = 0;
  for (int r = 0; r < ranks; ++r) {
    ring_max = std::max(ring_max, all[5 * r]);
    local_max = std::max(local_max, all[5 * r + 1]);
    dense_max = std::max(dense_max, all[5 * r + 2]);
    wait_max = std::max(wait_max, all[5 * r + 3] / all[5 * r]);
    worst = std::max(worst, all[5 * r + 4]);
  }
  // The convention (S² per head, half causal); a window counts the scores it keeps.
  double per_gpu = attention_flops(B, H, S, D, c.causal) / ranks;
  if (plan.window > 0) {
    per_gpu = 0;
    for (int r = 0; r < ranks; ++r) per_gpu += dist::ring_attention_flops(plan, r, B * H, D) / ranks;
  }
  const double ring_tf = per_gpu / ring_max * 1e-9, local_tf = per_gpu / local_max * 1e-9;
  const double dense_tf = dense ? per_gpu / dense_max * 1e-9 : 0;
  log << fmt::format("| {} | {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {} | {:.3f} | {} | {} | {} |\n", S, ranks,
                     c.ulysses ? "all-to-all" : "ring", c.fp8 ? "fp8" : "bf16", mask_name(plan),
                     plan.sharding == RingPlan::Sharding::zigzag ? "zigzag" : "contiguous", ring_max, ring_tf, local_tf,
                     !dense ? std::string("-") : fmt::format("{:.1f}", dense_tf), ring_tf / local_tf,
                     !dense ? std::string("-") : fmt::format("{:.3f}", ring_tf / dense_tf),
                     c.ulysses ? std::string("-") : fmt::format("{:.1f}%", 100 * wait_max),
                     c.ulysses ? std::string("-") : fmt::format("{:.1f}%", 100 * worst));
}

}  // namespace

std::vector<kernels::DilatedPair> parse_dilated(const std::string& spec) {
  std::vector<kernels::DilatedPair> pairs;
  for (size_t start = 0;;) {
    const size_t end = spec.find(',', start);
    const std::string item = spec.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const size_t colon = item.find(':');
    size_t used_w = 0, used_r = 0;
    int64_t w = 0, r = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      w = std::stoll(item.substr(0, colon), &used_w);
      r = std::stoll(item.substr(colon + 1), &used_r);
    } catch (const std::exception&) {
      used_w = 0;
    }
    if (colon == std::string::npos || used_w != colon || used_r != item.size() - colon - 1)
      throw Error(fmt::format("--dilated: '{}' is not SEGMENT:RATE (e.g. --dilated 2048:1,8192:2)", item));
    pairs.push_back({w, r});
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return pairs;
}

RingBenchOptions resolved(const RingBenchOptions& in) {
  RingBenchOptions opt = in;
  if (opt.kv_heads <= 0) opt.kv_heads = opt.heads;
  if (opt.dtypes.empty()) opt.dtypes = {"bf16", "fp8"};
  if (opt.seqs.empty()) opt.seqs = opt.check ? std::vector<int64_t>{16384} : std::vector<int64_t>{131072, 262144, 524288, 1048576};
  if (opt.strategies.empty()) opt.strategies = {"ring", "all-to-all"};
  for (const std::string& d : opt.dtypes)
    if (d != "bf16" && d != "fp8") throw Error(fmt::format("--dtype {}: expected bf16 or fp8", d));
  for (const std::string& st : opt.strategies)
    if (st != "ring" && st != "all-to-all") throw Error(fmt::format("--strategy {}: expected ring or all-to-all", st));
  if (opt.sharding != "zigzag" && opt.sharding != "contiguous")
    throw Error(fmt::format("--sharding {}: expected zigzag or contiguous", opt.sharding));
  for (int64_t S : opt.seqs)
    if (S < 1) throw Error(fmt::format("--seq {}: a sequence length is at least 1", S));
  if (opt.batch < 1 || opt.heads < 1 || opt.head_dim < 1)
    throw Error(fmt::format("--batch {}, --heads {}, --head-dim {}: each at least 1", opt.batch, opt.heads, opt.head_dim));
  if (opt.heads % opt.kv_heads != 0)
    throw Error(fmt::format("--heads {} is not a multiple of --kv-heads {}", opt.heads, opt.kv_heads));
  if (opt.window < 0) throw Error(fmt::format("--window {}: a window is at least 1 key (0: none)", opt.window));
  if (opt.window > 0 && opt.non_causal_only) throw Error("--window is a causal sliding window: not with --non-causal");
  if (opt.reps < 1 || opt.warmup < 0) throw Error(fmt::format("--reps {} / --warmup {}: at least 1 / 0", opt.reps, opt.warmup));
  if (!opt.dilated.empty()) {
    parse_dilated(opt.dilated);
    if (!opt.check) throw Error("--dilated is checked (--check), not timed yet");
  }
  if (opt.backward && !opt.dilated.empty()) throw Error("--backward and --dilated: one at a time");
  return opt;
}

int ring_rank_main(const RingBenchOptions& in) {
  const RingBenchOptions opt = resolved(in);
  const RingPlan::Sharding sharding = opt.sharding == "zigzag" ? RingPlan::Sharding::zigzag : RingPlan::Sharding::contiguous;
  runtime::current_device();
  ncclUniqueId id;
  bytes_of_hex(opt.nccl_id, &id, sizeof id);
  ncclComm_t comm = nullptr;
  nccl(ncclCommInitRank(&comm, opt.gpus, id, opt.rank), "ncclCommInitRank");
  runtime::Stream stream;
  const int rank = opt.rank, ranks = opt.gpus;
  std::ostringstream table;
  if (rank == 0) {
    const runtime::DeviceInfo& dev = runtime::current_device();
    table << fmt::format("ring attention on {} x {}, B {}, H {} (K / V heads {}), D {}\n\n", ranks, dev.name, opt.batch, opt.heads,
                         opt.kv_heads, opt.head_dim);
    table << (opt.check ? "| S | GPUs | strategy | dtype | mask | rank | rel RMSE vs single GPU | ours vs float64 | single GPU vs float64 | |\n"
                          "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- |\n"
                        : "| S | GPUs | strategy | dtype | mask | sharding | ms | TFLOP/s per GPU | same launches, one GPU | dense launch, one GPU "
                          "| vs same launches | vs dense | compute waits | worst step |\n"
                          "| ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    std::cout << table.str() << std::flush;
  }
  bool ok = true;
  if (opt.backward)
    for (int64_t S : opt.seqs)
      for (bool causal : {false, true}) {
        if ((causal && opt.non_causal_only) || (!causal && opt.causal_only)) continue;
        if (opt.window > 0 && !causal) continue;   // a window is causal
        std::ostringstream row;
        if (opt.check) ok = check_backward(comm, rank, ranks, opt, S, causal, sharding, stream, row) && ok;
        else time_backward(comm, rank, ranks, opt, S, causal, sharding, stream, row);
        if (rank == 0) {
          std::cout << row.str() << std::flush;
          table << row.str();
        }
      }
  if (!opt.dilated.empty()) {
    const std::vector<kernels::DilatedPair> pairs = parse_dilated(opt.dilated);
    for (int64_t S : opt.seqs)
      for (const std::string& d : opt.dtypes)
        for (bool causal : {false, true}) {
          if ((causal && opt.non_causal_only) || (!causal && opt.causal_only)) continue;
          std::ostringstream row;
          ok = check_dilated(comm, rank, ranks, opt, pairs, S, d == "fp8", causal, stream, row) && ok;
          if (rank == 0) {
            std::cout << row.str() << std::flush;
            table << row.str();
          }
        }
  }
  for (int64_t S : opt.dilated.empty() && !opt.backward ? opt.seqs : std::vector<int64_t>{})
    for (const std::string& strategy : opt.strategies)
    for (const std::string& d : opt.dtypes)
      for (bool causal : {false, true}) {
        if ((causal && opt.non_causal_only) || (!causal && opt.causal_only)) continue;
        const Case c{S, d == "fp8", causal, strategy == "all-to-all"};
        // Zigzag balances the ring's causal work; all-to-all places each chunk at its rows (any
        // sharding). A window is causal, on contiguous chunks (the ring then stops early); the
        // all-to-all strategy does not take one.
        if (opt.window > 0 && (!causal || c.ulysses)) continue;
        const RingPlan plan(ranks, S, causal && !opt.window ? sharding : RingPlan::Sharding::contiguous, causal, opt.window);
        std::ostringstream row;
        if (opt.check) ok = check_case(comm, rank, ranks, opt, c, plan, stream, row) && ok;
        else time_case(comm, rank, ranks, opt, c, plan, stream, row);
        if (rank == 0) {
          std::cout << row.str() << std::flush;
          table << row.str();
        }
      }
  if (rank == 0 && !opt.out.empty()) std::ofstream(opt.out) << table.str();
  ncclCommDestroy(comm);
  return ok ? 0 : 1;
}

}  // namespace tj::tools
