// dist/ring_attention.h (ring attention over NCCL) and the tilejit-ring launcher's pieces: the
// checks before anything is sent (CPU), a ring of one rank on the GPU against the float64
// attention, and, on a machine of two GPUs or more, `tilejit-ring --check` (one process per GPU,
// the ring against single-GPU attention and float64). Built as tilejit_dist_tests: it links NCCL.
#include <doctest/doctest.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "attention_accuracy.h"
#include "core/error.h"
#include "dist/dilated_ring.h"
#include "dist/ring_attention.h"
#include "dist/ring_backward.h"
#include "kernels/attention_backward.h"
#include "dist/ulysses_attention.h"
#include "gpu.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "tools/ring_bench.h"

using namespace tj;
using kernels::RingPlan;

namespace {

TensorView fake(DType dt, std::vector<int64_t> shape) {
  TensorView v;
  v.data = reinterpret_cast<void*>(uintptr_t{1} << 20);
  v.dtype = dt;
  v.shape = std::move(shape);
  v.device = Device::cuda;
  return v;
}

// A communicator of one rank on tilejit's device, destroyed with it.
struct OneRank {
  ncclComm_t comm = nullptr;
  OneRank() {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    runtime::current_device();
    REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  }
  ~OneRank() { ncclCommDestroy(comm); }
  OneRank(const OneRank&) = delete;
  OneRank& operator=(const OneRank&) = delete;
};

std::string plan_error(int64_t ranks, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const dist::RingAttentionOptions& opt = {}) {
  try {
    dist::ring_attention_plan(ranks, q, k, v, o, opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("ring attention: shapes, dtypes and layouts that do not fit are errors before anything is sent") {
  const TensorView q = fake(DType::bf16, {1, 8, 1024, 128}), kv = fake(DType::bf16, {1, 2, 1024, 128});
  CHECK(plan_error(4, q, kv, kv, q) == "");
  CHECK(plan_error(4, fake(DType::bf16, {8, 1024, 128}), kv, kv, q) ==
        "ring attention: q is bf16[8, 1024, 128] (cuda): expected [B, H, n, D] (this rank's rows)");
  TensorView host = q;
  host.device = Device::host;
  CHECK(plan_error(4, q, kv, kv, host) == "ring attention: o is bf16[1, 8, 1024, 128] (host): expected a device tensor");
  TensorView strided = kv;
  strided.strides = {2 * 1024 * 256, 1024 * 256, 256, 1};
  CHECK(plan_error(4, q, strided, kv, q).find("k is bf16[1, 2, 1024, 128]") != std::string::npos);
  CHECK(plan_error(4, q, strided, kv, q).find("expected a contiguous tensor") != std::string::npos);
  CHECK(plan_error(4, fake(DType::f32, {1, 8, 1024, 128}), kv, kv, q) ==
        "ring attention: q is f32[1, 8, 1024, 128] (cuda): expected bf16 or f16 (fp8 = true quantizes them to e4m3 here)");
  CHECK(plan_error(4, q, fake(DType::f16, {1, 2, 1024, 128}), kv, q) ==
        "ring attention: q, k, v and o must share one dtype: bf16, f16, bf16, bf16");
  CHECK(plan_error(4, q, fake(DType::bf16, {1, 3, 1024, 128}), fake(DType::bf16, {1, 3, 1024, 128}), q) ==
        "ring attention: q's 8 heads are not a multiple of k's 3 (grouped-query attention)");
  CHECK(plan_error(4, q, fake(DType::bf16, {1, 2, 512, 128}), fake(DType::bf16, {1, 2, 512, 128}), q) ==
        "ring attention: k bf16[1, 2, 512, 128] (cuda) must hold the same batch, rows and head dim as q bf16[1, 8, 1024, 128] "
        "(cuda)");
  CHECK(plan_error(4, q, kv, fake(DType::bf16, {1, 2, 1024, 64}), q).find("ring attention: k bf16[1, 2, 1024, 128] (cuda) and v") ==
        0);
  dist::RingAttentionOptions opt;
  opt.lse = fake(DType::f32, {1, 8, 1000});
  CHECK(plan_error(4, q, kv, kv, q, opt) == "ring attention: lse is f32[1, 8, 1000] (cuda): expected f32[1, 8, 1024]");
  // zigzag: two chunks of n / 2 rows per rank
  const TensorView q_odd = fake(DType::bf16, {1, 8, 1001, 128}), kv_odd = fake(DType::bf16, {1, 8, 1001, 128});
  CHECK(plan_error(2, q_odd, kv_odd, kv_odd, q_odd).find("does not split into 4 equal chunks (2 ranks, zigzag: two chunks each)") !=
        std::string::npos);
  opt = {};
  opt.fp8 = true;
  const TensorView q_8 = fake(DType::bf16, {1, 8, 1000, 128}), kv_8 = fake(DType::bf16, {1, 8, 1000, 128});
  CHECK(plan_error(2, q_8, kv_8, kv_8, q_8, opt) ==
        "ring attention: fp8: chunks of 500 rows (ring attention over 2 ranks, 2000 rows in 4 chunks of 500 (zigzag)): each "
        "chunk of Vᵀ starts 16 bytes aligned only at a multiple of 16 rows; pad the sequence to a multiple of 64");
}

TEST_CASE("all-to-all attention: the ring's checks, and heads that do not split over the ranks, are errors before anything is sent") {
  const TensorView q = fake(DType::bf16, {1, 8, 1024, 128}), kv = fake(DType::bf16, {1, 2, 1024, 128});
  CHECK(dist::ulysses_attention_plan(2, q, kv, kv, q, {}).chunk_rows() == 1024);
  try {
    dist::ulysses_attention_plan(4, q, kv, kv, fake(DType::bf16, {1, 8, 512, 128}), {});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "ulysses attention: o bf16[1, 8, 512, 128] (cuda) differs from q bf16[1, 8, 1024, 128] (cuda)");
  }
  try {
    dist::ulysses_attention_plan(4, q, fake(DType::bf16, {1, 2, 1024, 128}), fake(DType::bf16, {1, 2, 1024, 128}), q, {});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "ulysses attention: 8 query heads and 2 K / V heads must both split over 4 ranks (each rank computes whole heads); "
          "the ring (ring_attention_forward) takes any head count");
  }
}

TEST_CASE("dilated ring attention: a pair's segments lie in one rank's rows or span whole ranks, else an error before anything is sent") {
  const TensorView q = fake(DType::bf16, {1, 8, 4096, 64});
  CHECK(dist::dilated_ring_spanning(4, q, {{2048, 1}, {4096, 2}, {8192, 4}, {65536, 8}}) == std::vector<bool>{false, false, true, true});
  try {
    dist::dilated_ring_spanning(4, q, {{6144, 2}});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "dilated ring attention: pair (segment 6144, rate 2): a segment must lie in one rank's 4096 rows (a divisor of 4096) or "
          "span whole ranks' rows (a multiple of 4096 whose ranks divide the 4 ranks)");
  }
  CHECK_THROWS_WITH_AS(dist::dilated_ring_spanning(3, q, {{8192, 2}}),
                       "dilated ring attention: pair (segment 8192, rate 2): a segment must lie in one rank's 4096 rows (a divisor "
                       "of 4096) or span whole ranks' rows (a multiple of 4096 whose ranks divide the 3 ranks)",
                       Error);
  CHECK_THROWS_WITH_AS(dist::dilated_ring_spanning(4, q, {{2048, 3}}),
                       "dilated ring attention: pair (segment 2048, rate 3): the rate must divide the segment length, the number "
                       "of heads (8) and each rank's rows (4096)",
                       Error);
}

TEST_CASE("tilejit-ring --dilated: SEGMENT:RATE pairs, and an item that is not one is an error naming it") {
  const auto pairs = tools::parse_dilated("2048:1,8192:2");
  REQUIRE(pairs.size() == 2);
  CHECK(pairs[1].segment == 8192);
  CHECK(pairs[1].rate == 2);
  for (const char* bad : {"2048", "2048:x", "a:1", "2048:1,", "2048:1:2"})
    CHECK_THROWS_AS(tools::parse_dilated(bad), Error);
  CHECK_THROWS_WITH_AS(tools::parse_dilated("2048:1,8192"),
                       "--dilated: '8192' is not SEGMENT:RATE (e.g. --dilated 2048:1,8192:2)", Error);
}

TEST_CASE("tilejit-ring: options are resolved with their defaults, and a wrong one is an error naming it before any rank starts") {
  tools::RingBenchOptions o;
  const tools::RingBenchOptions d = tools::resolved(o);
  CHECK(d.kv_heads == d.heads);
  CHECK(d.dtypes == std::vector<std::string>{"bf16", "fp8"});
  CHECK(d.strategies == std::vector<std::string>{"ring", "all-to-all"});
  CHECK(d.seqs == std::vector<int64_t>{131072, 262144, 524288, 1048576});
  o.check = true;
  CHECK(tools::resolved(o).seqs == std::vector<int64_t>{16384});
  auto error_of = [](tools::RingBenchOptions x) {
    try {
      tools::resolved(x);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  tools::RingBenchOptions x;
  x.dtypes = {"bf17"};
  CHECK(error_of(x) == "--dtype bf17: expected bf16 or fp8");
  x = {};
  x.strategies = {"tree"};
  CHECK(error_of(x) == "--strategy tree: expected ring or all-to-all");
  x = {};
  x.sharding = "striped";
  CHECK(error_of(x) == "--sharding striped: expected zigzag or contiguous");
  x = {};
  x.seqs = {0};
  CHECK(error_of(x) == "--seq 0: a sequence length is at least 1");
  x = {};
  x.kv_heads = 3;
  CHECK(error_of(x) == "--heads 8 is not a multiple of --kv-heads 3");
  x = {};
  x.window = 64;
  x.non_causal_only = true;
  CHECK(error_of(x) == "--window is a causal sliding window: not with --non-causal");
  x = {};
  x.window = -1;
  CHECK(error_of(x) == "--window -1: a window is at least 1 key (0: none)");
  x = {};
  x.reps = 0;
  CHECK(error_of(x) == "--reps 0 / --warmup 1: at least 1 / 0");
  x = {};
  x.dilated = "2048:1";
  CHECK(error_of(x) == "--dilated is checked (--check), not timed yet");
  x = {};
  x.backward = true;
  x.check = true;
  x.dilated = "2048:1";
  CHECK(error_of(x) == "--backward and --dilated: one at a time");
  x = {};
  x.check = true;
  x.dilated = "2048";
  CHECK(error_of(x) == "--dilated: '2048' is not SEGMENT:RATE (e.g. --dilated 2048:1,8192:2)");
}

TEST_CASE("ring attention: the flops of a rank are its plan's scores times 4 D") {
  const RingPlan plan(4, 4096, RingPlan::Sharding::zigzag, true);
  for (int64_t r = 0; r < 4; ++r) CHECK(dist::ring_attention_flops(plan, r, 16, 128) == 4.0 * 128 * 16 * plan.work(r));
}

TEST_CASE("tilejit-ring: the NCCL id crosses to the ranks as hex, and text of another length or not hex is an error") {
  unsigned char id[8] = {0, 1, 0x7f, 0x80, 0xab, 0xcd, 0xef, 0xff}, back[8] = {};
  const std::string hex = tools::hex_of(id, sizeof id);
  CHECK(hex == "00017f80abcdefff");
  tools::bytes_of_hex(hex, back, sizeof back);
  CHECK(std::equal(id, id + 8, back));
  try {
    tools::bytes_of_hex("0001", back, sizeof back);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "--nccl-id: expected 16 hex digits, got '0001'");
  }
  CHECK_THROWS_AS(tools::bytes_of_hex("00017f80abcdefzz", back, sizeof back), Error);
}

TEST_CASE("gpu: a ring (and an all-to-all) of one rank is attention over its rows (bf16 and fp8, causal and not, GQA), against float64") {
  TJ_REQUIRE_HOPPER();
  OneRank one;
  ncclComm_t comm = one.comm;
  std::mt19937 rng(40);
  const int64_t B = 1, H = 4, Hkv = 2, S = 512, D = 128;
  const HostTensor q = tj_test::randn(DType::bf16, {B, H, S, D}, rng), k = tj_test::randn(DType::bf16, {B, Hkv, S, D}, rng),
                   v = tj_test::randn(DType::bf16, {B, Hkv, S, D}, rng);
  const DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), dv = DeviceTensor::from_host(v);
  for (bool fp8 : {false, true})
    for (bool causal : {false, true}) {
      CAPTURE(fp8);
      CAPTURE(causal);
      DeviceTensor o(DType::bf16, {B, H, S, D}), lse(DType::f32, {B, H, S});
      o.fill_bytes(0xFF);
      lse.fill_bytes(0xFF);
      dist::RingAttentionOptions opt;
      opt.fp8 = fp8;
      opt.causal = causal;
      opt.lse = lse.view();
      opt.record_steps = true;
      dist::RingAttentionWorkspace ws;
      dist::ring_attention_forward(comm, dq.view(), dk.view(), dv.view(), o.view(), opt, ws);
      ws.read_step_times();
      CHECK(ws.steps.size() == 1);
      // All-to-all over one rank: the same rows (its gathered heads are all of them).
      DeviceTensor o2(DType::bf16, {B, H, S, D});
      o2.fill_bytes(0xFF);
      dist::UlyssesAttentionOptions uo;
      uo.fp8 = fp8;
      uo.causal = causal;
      dist::UlyssesAttentionWorkspace uws;
      dist::ulysses_attention_forward(comm, dq.view(), dk.view(), dv.view(), o2.view(), uo, uws);
      const HostTensor ho2 = o2.to_host();
      const HostTensor ho = o.to_host(), hl = lse.to_host();
      std::vector<double> got, got2, want, got_lse, want_lse;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < S; i += 7) {
          const int64_t hk = h / (H / Hkv), last = causal ? i : S - 1;
          std::vector<double> p(last + 1);
          double mx = -INFINITY, sum = 0;
          for (int64_t j = 0; j <= last; ++j) {
            double d = 0;
            for (int64_t x = 0; x < D; ++x) d += q.at((h * S + i) * D + x) * k.at((hk * S + j) * D + x);
            mx = std::max(mx, p[j] = d / std::sqrt(double(D)));
          }
          for (int64_t j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
          want_lse.push_back(mx + std::log(sum));
          got_lse.push_back(hl.at(h * S + i));
          for (int64_t x = 0; x < D; ++x) {
            double acc = 0;
            for (int64_t j = 0; j <= last; ++j) acc += p[j] * v.at((hk * S + j) * D + x);
            want.push_back(acc / sum);
            got.push_back(ho.at((h * S + i) * D + x));
            got2.push_back(ho2.at((h * S + i) * D + x));
          }
        }
      const tj_test::Metrics m = tj_test::compare(got, want), ml = tj_test::compare(got_lse, want_lse),
                             m2 = tj_test::compare(got2, want);
      MESSAGE("all-to-all of one: o ", tj_test::str(m2));
      CHECK(m2.nan == 0);
      CHECK(m2.rel_rmse <= (fp8 ? 6e-2 : 5e-3));
      MESSAGE("ring of one, ", fp8 ? "fp8" : "bf16", causal ? " causal" : "", ": o ", tj_test::str(m), "; lse ", tj_test::str(ml));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= (fp8 ? 6e-2 : 5e-3));
      // fp8: the LSE of the e4m3 P's sums (the merging launches weigh their keys by it), a few % off
      CHECK(ml.max_abs <= (fp8 ? 1e-1 : 1e-3));
    }
}

TEST_CASE("gpu: the ring backward of one rank equals attention_backward on one GPU (bf16, causal and not, GQA)") {
  TJ_REQUIRE_HOPPER();
  OneRank one;
  ncclComm_t comm = one.comm;
  std::mt19937 rng(41);
  for (int64_t Hkv : {4, 2})
  for (bool causal : {false, true}) {
    CAPTURE(Hkv);
    CAPTURE(causal);
    const std::vector<int64_t> shape = {1, 4, 512, 128}, kv_shape = {1, Hkv, 512, 128};
    const DeviceTensor q = DeviceTensor::from_host(tj_test::randn(DType::bf16, shape, rng)),
                       k = DeviceTensor::from_host(tj_test::randn(DType::bf16, kv_shape, rng)),
                       v = DeviceTensor::from_host(tj_test::randn(DType::bf16, kv_shape, rng)),
                       dout = DeviceTensor::from_host(tj_test::randn(DType::bf16, shape, rng));
    DeviceTensor o(DType::bf16, shape), lse(DType::f32, {1, 4, 512});
    dist::RingAttentionOptions fo;
    fo.causal = causal;
    fo.lse = lse.view();
    dist::RingAttentionWorkspace fws;
    dist::ring_attention_forward(comm, q.view(), k.view(), v.view(), o.view(), fo, fws);
    DeviceTensor g[3] = {DeviceTensor(DType::bf16, shape), DeviceTensor(DType::bf16, kv_shape), DeviceTensor(DType::bf16, kv_shape)};
    DeviceTensor want[3] = {DeviceTensor(DType::bf16, shape), DeviceTensor(DType::bf16, kv_shape),
                            DeviceTensor(DType::bf16, kv_shape)};
    for (auto* t : {&g[0], &g[1], &g[2]}) t->fill_bytes(0xFF);
    dist::RingBackwardOptions bo;
    bo.causal = causal;
    dist::RingBackwardWorkspace bws;
    dist::ring_attention_backward(comm, q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), g[0].view(), g[1].view(),
                                  g[2].view(), bo, bws);
    kernels::AttentionBackwardOptions ko;
    ko.causal = causal;
    kernels::AttentionBackwardWorkspace kws;
    kernels::attention_backward(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), want[0].view(), want[1].view(),
                                want[2].view(), ko, kws);
    for (int i = 0; i < 3; ++i) {
      const HostTensor a = g[i].to_host(), b = want[i].to_host();
      const tj_test::Metrics m = tj_test::compare(a.values(), b.values());
      MESSAGE("d", "qkv"[i], " ring of one vs attention_backward: ", tj_test::str(m));
      CHECK(m.nan == 0);
      CHECK(m.rel_rmse <= 1e-2);   // dq: f32 atomic sums against the dQ kernel's
    }
  }
}

TEST_CASE("gpu: tilejit-ring --check on two GPUs: ring and all-to-all equal single-GPU attention of the whole sequence") {
  TJ_REQUIRE_HOPPER();
  if (runtime::driver().device_count() < 2) {
    const std::string msg = "SKIPPED: " + tj_test::current_test_name() + ": one GPU here (a ring needs two)";
    MESSAGE(msg);
    std::cerr << msg << std::endl;
    return;
  }
  // The built program, or the one beside this test program (a carried bundle: scripts/device_bundle.sh).
  std::string exe = TJ_RING_EXE;
  const std::filesystem::path sibling = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "tilejit-ring";
  if (!std::filesystem::exists(exe) && std::filesystem::exists(sibling)) exe = sibling.string();
  const std::string cmd = exe + " --check --seq 8192 --heads 4 --kv-heads 2 --gpus 2 2>&1";
  CHECK(std::system(cmd.c_str()) == 0);
  const std::string backward = exe + " --check --backward --seq 4096 --heads 4 --gpus 2 2>&1";
  CHECK(std::system(backward.c_str()) == 0);
  const std::string backward_gqa = exe + " --check --backward --seq 4096 --heads 4 --kv-heads 2 --gpus 2 2>&1";
  CHECK(std::system(backward_gqa.c_str()) == 0);
}
