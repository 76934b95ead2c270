// The autotuner on a real GPU: tuning vector_add and softmax with a small budget, faulting
// and hanging candidates contained in the worker process, tj::launch picking up the tuned
// config (and a second process doing so without compiling anything), and the host overhead
// of a cached launch next to a raw cuLaunchKernel.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "autotune/cache.h"
#include "autotune/launch_plan.h"
#include "autotune/tuner.h"
#include "gpu.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"

using namespace tj;
using namespace tj::autotune;
namespace fs = std::filesystem;

namespace {

HostTensor random_host(DType dt, std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t(dt, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, n(rng));
  return t;
}

std::string counts(const TuneResult& r) {
  std::map<std::string, int> n;
  for (const auto& c : r.candidates) ++n[std::string(name(c.status))];
  std::string s;
  for (const auto& [k, v] : n) s += fmt::format(" {} {}", v, k);
  return s;
}

// Gives the test its own cache directory (CUBINs and tuning.json), so that the configs it
// tunes do not change what other tests launch; the child process inherits it.
class PrivateCache {
 public:
  explicit PrivateCache(const std::string& name)
      : dir_(fs::temp_directory_path() / fmt::format("tilejit-autotune-gpu-{}-{}", ::getpid(), name)) {
    if (const char* old = std::getenv("TILEJIT_CACHE_DIR")) old_ = old;
    fs::remove_all(dir_);
    ::setenv("TILEJIT_CACHE_DIR", dir_.c_str(), 1);
    clear_launch_plans();
  }
  ~PrivateCache() {
    if (old_) ::setenv("TILEJIT_CACHE_DIR", old_->c_str(), 1);
    else ::unsetenv("TILEJIT_CACHE_DIR");
    clear_launch_plans();   // plans built from this cache's tuned configs
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

 private:
  fs::path dir_;
  std::optional<std::string> old_;
};

TuneOptions small_budget(double seconds) {
  TuneOptions o;
  o.effort = Effort::quick;
  o.time_budget_s = seconds;
  o.progress = true;
  o.use_cache = false;
  return o;
}

}  // namespace

TEST_CASE("autotune gpu: tune vector_add and launch with the tuned config") {
  TJ_REQUIRE_GPU();
  PrivateCache cache("tune64");
  const Kernel& k = kernels::vector_add();
  const int64_t n = (1 << 20) + 3;
  auto specs = kernels::find("vector_add").arguments({DType::f32, {}, {n}, false});
  TuneOptions o = small_budget(20);
  TuneResult r = tune(k, specs, o);
  MESSAGE(fmt::format("vector_add: {} ({} candidates:{}) in {:.1f} s; best {:.4f} ms {} vs default {:.4f} ms", r.space,
                      r.candidates.size(), counts(r), r.seconds, r.best_ms, r.best.to_json(), r.reference_ms));
  CHECK(r.stored);
  CHECK(r.isolated);
  CHECK(std::isfinite(r.best_ms));
  CHECK(r.best_ms <= r.reference_ms * 1.0001);
  for (const auto& c : r.candidates) {
    CHECK_MESSAGE(c.status != Candidate::Status::wrong, c.config.to_json(), ": ", c.detail);
    CHECK_MESSAGE(c.status != Candidate::Status::fault, c.config.to_json(), ": ", c.detail);
  }

  // tj::launch without a config now uses the tuned one, and computes the right thing.
  HostTensor x = random_host(DType::f32, {n}, 1), y = random_host(DType::f32, {n}, 2);
  DeviceTensor dx = DeviceTensor::from_host(x), dy = DeviceTensor::from_host(y), dout(DType::f32, {n});
  dout.fill_bytes(0xFF);
  std::vector<Arg> args = {dx.view(), dy.view(), dout.view()};
  LaunchPlan plan = plan_launch(k, args, false);
  CHECK(plan.tuned);
  CHECK(plan.kernel->config == r.best);
  launch(k, args);
  runtime::synchronize();
  HostTensor got = dout.to_host();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += got.at(i) != static_cast<double>(static_cast<float>(x.at(i) + y.at(i)));
  CHECK(bad == 0);

  // Launched to start early it takes the tuned config too, compiled apart for it (sm_90+), in a
  // plan of its own.
  LaunchPlan early = plan_launch(k, args, false, true);
  CHECK(early.tuned);
  CHECK(early.kernel->config == r.best);
  CHECK(early.kernel != plan.kernel);
  CHECK(early.kernel->generated.starts_early == (runtime::current_device().arch().rfind("sm_9", 0) == 0));
  CHECK_FALSE(plan.kernel->generated.starts_early);
  CHECK(plan_launch(k, args, false).kernel == plan.kernel);
  dout.fill_bytes(0xFF);
  LaunchOptions lo;
  lo.start_early = true;
  launch(k, args, lo);
  runtime::synchronize();
  got = dout.to_host();
  bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += got.at(i) != static_cast<double>(static_cast<float>(x.at(i) + y.at(i)));
  CHECK(bad == 0);
}

TEST_CASE("autotune gpu: tune softmax for real, every candidate checked against the default") {
  TJ_REQUIRE_GPU();
  PrivateCache cache("tune82");
  const Kernel& k = kernels::softmax();
  auto specs = kernels::find("softmax").arguments({DType::f16, {}, {256, 3000}, false});
  TuneOptions o = small_budget(30);
  TuneResult r = tune(k, specs, o);
  MESSAGE(fmt::format("softmax: {} ({} candidates:{}) in {:.1f} s, {} NVRTC compiles; best {:.4f} ms {} vs default {:.4f} ms",
                      r.space, r.candidates.size(), counts(r), r.seconds, r.nvrtc_compiles, r.best_ms, r.best.to_json(),
                      r.reference_ms));
  CHECK(r.stored);
  CHECK(r.seconds < 60);
  int ok = 0;
  for (const auto& c : r.candidates) {
    ok += c.status == Candidate::Status::ok;
    CHECK_MESSAGE(c.status != Candidate::Status::wrong, c.config.to_json(), ": ", c.detail);
    CHECK_MESSAGE(c.status != Candidate::Status::fault, c.config.to_json(), ": ", c.detail);
    CHECK_MESSAGE(c.status != Candidate::Status::error, c.config.to_json(), ": ", c.detail);
  }
  CHECK(ok >= 3);
  // The winner against the CPU reference executor.
  HostTensor x = random_host(DType::f16, {256, 3000}, 3);
  HostTensor ref(DType::f16, {256, 3000});
  ir::Function f = k.trace(specs);
  run_reference(f, r.best, {x.view(), ref.view()});
  DeviceTensor dx = DeviceTensor::from_host(x), dout(DType::f16, {256, 3000});
  dout.fill_bytes(0xFF);
  launch(k, {dx.view(), dout.view()});
  runtime::synchronize();
  HostTensor got = dout.to_host();
  double max_err = 0;
  int64_t nan = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::isnan(got.at(i))) ++nan;
    else max_err = std::max(max_err, std::abs(got.at(i) - ref.at(i)));
  }
  CHECK(nan == 0);
  CHECK(max_err <= 4e-3);
}

TEST_CASE("autotune gpu: a faulting and a hanging candidate are contained") {
  TJ_REQUIRE_GPU();
  PrivateCache cache("a64");
  const Kernel& k = kernels::vector_add();
  auto specs = kernels::find("vector_add").arguments({DType::f32, {}, {1 << 16}, false});
  TuneOptions o = small_budget(60);
  o.store = false;
  o.candidate_timeout_s = 5;
  o.space.max_block_1d = 256;
  for (int fault : {1, 2}) {
    Config c = default_config(k.trace(specs));
    c.knobs[knob_names::fault] = fault;   // 1: illegal address, 2: a kernel that never ends
    o.extra_candidates.push_back(c);
  }
  TuneResult r = tune(k, specs, o);
  MESSAGE(fmt::format("fault containment: {} candidates:{}; {} workers started; {:.1f} s", r.candidates.size(), counts(r),
                      r.worker_starts, r.seconds));
  std::map<int64_t, const Candidate*> by_fault;
  for (const auto& c : r.candidates)
    if (c.config.knobs.count(knob_names::fault)) by_fault[c.config.knobs.at(knob_names::fault)] = &c;
  REQUIRE(by_fault.size() == 2);
  CHECK(by_fault[1]->status == Candidate::Status::fault);
  CHECK_MESSAGE(by_fault[1]->detail.find("CUDA_ERROR_ILLEGAL_ADDRESS") != std::string::npos, by_fault[1]->detail);
  CHECK(by_fault[2]->status == Candidate::Status::timeout);
  CHECK(r.worker_starts == 3);
  int ok = 0;
  for (const auto& c : r.candidates) ok += c.status == Candidate::Status::ok;
  CHECK(ok >= 5);   // the tuning went on after both
  CHECK_FALSE(r.best.knobs.count(knob_names::fault));
  // This process's own CUDA context is untouched.
  DeviceTensor a(DType::f32, {1 << 16}), b(DType::f32, {1 << 16}), out(DType::f32, {1 << 16});
  a.fill_bytes(0);
  b.fill_bytes(0);
  CHECK_NOTHROW(launch(k, {a.view(), b.view(), out.view()}));
  CHECK_NOTHROW(runtime::synchronize());
}

// Run by the next test in a second process (TJ_AUTOTUNE_CHILD=<file>): launches the tuned
// kernels and writes how many NVRTC compiles it needed.
TEST_CASE("autotune gpu: child process launch") {
  const char* report = std::getenv("TJ_AUTOTUNE_CHILD");
  if (!report) return;   // only as the child of the test below
  TJ_REQUIRE_GPU();
  const Kernel& k = kernels::softmax();
  // The shape that was tuned: its CUBIN is on disk.
  DeviceTensor dx(DType::f16, {512, 2500}), dout(DType::f16, {512, 2500});
  dx.fill_bytes(0);
  std::vector<Arg> args = {dx.view(), dout.view()};
  LaunchPlan plan = plan_launch(k, args, false);
  launch(k, args);
  runtime::synchronize();
  const uint64_t compiles = nvrtc_compile_count();
  // Another shape of the same bucket gets the same config (compiled for its shape).
  DeviceTensor dx2(DType::f16, {512, 3000}), dout2(DType::f16, {512, 3000});
  LaunchPlan plan2 = plan_launch(k, {dx2.view(), dout2.view()}, false);
  std::ofstream(report) << compiles << " " << (plan.tuned ? 1 : 0) << " " << (plan2.tuned ? 1 : 0) << " "
                        << plan.kernel->config.to_json() << " " << plan2.kernel->config.to_json() << "\n";
}

TEST_CASE("autotune gpu: a second process reuses the tuned config without compiling") {
  TJ_REQUIRE_GPU();
  PrivateCache cache("a74");
  const Kernel& k = kernels::softmax();
  // The child launches this shape, and [512, 3000] of the same bucket [512, 4096].
  auto specs = kernels::find("softmax").arguments({DType::f16, {}, {512, 2500}, false});
  TuneOptions o = small_budget(20);
  TuneResult r = tune(k, specs, o);
  REQUIRE(r.stored);
  fs::path report = fs::temp_directory_path() / fmt::format("tilejit-autotune-child-{}.txt", ::getpid());
  fs::remove(report);
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  REQUIRE_FALSE(ec);
  std::string cmd = fmt::format("TJ_AUTOTUNE_CHILD='{}' '{}' -tc='autotune gpu: child process launch' > /dev/null 2>&1",
                                report.string(), self.string());
  int rc = std::system(cmd.c_str());
  CHECK(rc == 0);
  std::ifstream in(report);
  uint64_t compiles = 999;
  int tuned = -1, tuned2 = -1;
  std::string config, config2;
  in >> compiles >> tuned >> tuned2 >> config >> config2;
  MESSAGE(fmt::format("second process: {} NVRTC compiles for the tuned shape, tuned config {}: {}; same bucket: {}", compiles,
                      tuned == 1 ? "used" : "NOT used", config, config2));
  CHECK(compiles == 0);
  CHECK(tuned == 1);
  CHECK(tuned2 == 1);
  CHECK(config == r.best.to_json());
  CHECK(config2 == r.best.to_json());
  fs::remove(report);
}

TEST_CASE("autotune gpu: host overhead of a cached launch next to a raw cuLaunchKernel") {
  TJ_REQUIRE_GPU();
  const Kernel& k = kernels::vector_add();
  const int64_t n = 4096;
  DeviceTensor a(DType::f32, {n}), b(DType::f32, {n}), out(DType::f32, {n});
  a.fill_bytes(0);
  b.fill_bytes(0);
  std::vector<Arg> args = {a.view(), b.view(), out.view()};
  runtime::Stream stream;
  LaunchOptions lo;
  lo.stream = stream;
  launch(k, args, lo);   // compiles, loads and caches the plan
  stream.synchronize();
  const uint64_t misses = launch_plan_misses();
  LaunchPlan plan = plan_launch(k, args, false);
  const CompiledKernel& ck = *plan.kernel;
  // The same launch by hand: packed once, straight to the driver.
  std::vector<std::vector<int64_t>> words;
  for (const DeviceTensor* t : {&a, &b, &out})
    words.push_back({static_cast<int64_t>(reinterpret_cast<uintptr_t>(t->view().data)), n, 1});
  std::vector<void*> ptrs;
  for (auto& w : words) ptrs.push_back(w.data());
  auto& drv = runtime::driver();
  const auto& g = plan.geometry;

  using clk = std::chrono::steady_clock;
  constexpr int kBatch = 200, kRounds = 25;
  double tj_us = 1e30, raw_us = 1e30;
  for (int round = 0; round < kRounds; ++round) {
    auto t0 = clk::now();
    for (int i = 0; i < kBatch; ++i) launch(k, args, lo);
    auto t1 = clk::now();
    stream.synchronize();
    auto t2 = clk::now();
    for (int i = 0; i < kBatch; ++i)
      drv.cuLaunchKernel(ck.function, g.grid.x, g.grid.y, g.grid.z, g.block.x, g.block.y, g.block.z,
                         static_cast<unsigned>(g.dynamic_smem), stream, ptrs.data(), nullptr);
    auto t3 = clk::now();
    stream.synchronize();
    tj_us = std::min(tj_us, std::chrono::duration<double, std::micro>(t1 - t0).count() / kBatch);
    raw_us = std::min(raw_us, std::chrono::duration<double, std::micro>(t3 - t2).count() / kBatch);
  }
  CHECK(launch_plan_misses() == misses);   // every launch above was a hit
  // A report, not an assertion: timings depend on the machine.
  std::printf("autotune launch overhead: tj::launch %.2f us/launch, raw cuLaunchKernel %.2f us/launch, overhead %.2f us "
              "(target <= 10 us; best of %d batches of %d)\n",
              tj_us, raw_us, tj_us - raw_us, kRounds, kBatch);
  std::fflush(stdout);
}

TEST_CASE("autotune gpu: a kernel made where an earlier one lived launches its own code, not the earlier one's plan") {
  TJ_REQUIRE_GPU();
  // Kernels made in a loop (a variant per iteration) sit at one address in turn; the launch plans
  // key on the definition's id, so the second launch compiles the second body.
  const int64_t n = 1000;
  HostTensor ha(DType::f32, {n});
  for (int64_t i = 0; i < n; ++i) ha.set(i, static_cast<double>(i % 17) - 8.0);
  const DeviceTensor a = DeviceTensor::from_host(ha);
  DeviceTensor out(DType::f32, {n});
  std::optional<Kernel> k;
  for (double factor : {2.0, -3.0}) {
    k.emplace(kernel("scale_by_constant", [factor](In x, Out y) {
      for (auto t : tile(x.dim(0), block("n"))) y.store(t, x.load(t) * factor);
    }));
    out.fill_bytes(0xFF);
    launch(*k, {a.view(), out.view()});
    const HostTensor got = out.to_host();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += got.at(i) != ha.at(i) * factor;
    CAPTURE(factor);
    CHECK(bad == 0);
  }
}
