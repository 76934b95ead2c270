// The autotuner without a GPU: config spaces, search strategies against synthetic cost
// functions with a known optimum, the tuning cache (round trip, corrupt and stale files,
// two processes writing at once), tuning keys, and the whole tuner driving a real worker
// process that simulates the GPU ($TILEJIT_TUNE_SIMULATE): compile pipeline, duplicate
// detection, faults and hangs contained, results stored and reused.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "autotune/cache.h"
#include "autotune/search.h"
#include "autotune/session.h"
#include "autotune/space.h"
#include "autotune/tuner.h"
#include "autotune/worker.h"
#include "kernels/library.h"
#include "runtime/hash.h"
#include "runtime/nvrtc.h"

using namespace tj;
using namespace tj::autotune;
namespace fs = std::filesystem;

namespace {

fs::path scratch_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("tilejit-autotune-test-{}-{}", ::getpid(), name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Captures what is written to stderr (fd 2) while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    path_ = fs::temp_directory_path() / fmt::format("tilejit-stderr-{}-{}", ::getpid(), counter_++);
    saved_ = ::dup(2);
    FILE* f = std::fopen(path_.c_str(), "w");
    ::dup2(::fileno(f), 2);
    std::fclose(f);
  }
  std::string text() {
    restore();
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  ~StderrCapture() {
    restore();
    fs::remove(path_);
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  static inline int counter_ = 0;
  fs::path path_;
  int saved_ = -1;
};

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const Dimension* find_dim(const ConfigSpace& s, const std::string& name) {
  for (const auto& d : s.dims())
    if (d.name == name) return &d;
  return nullptr;
}

// ---- a synthetic GPU-like landscape ------------------------------------------------------
// Dimensions as a GEMM/attention tuner sees them: tile_m, tile_n (16..256), warps (2,4,8),
// stages (1..4), warp specialization (0/1), raster group (1,4,8). The time has the features
// that make real landscapes hard: a register cliff (infeasible), spills (x1.6), shared-memory
// limits (infeasible), wave quantization over 132 SMs, interactions, and +-2% noise.
struct Landscape {
  int64_t M = 8192, N = 8192;
  double overhead = 24;        // per-tile edge cost: larger tiles reuse better
  int best_group = 1;
  uint64_t noise_seed = 0;
  std::vector<int> sizes = {5, 5, 3, 4, 2, 3};

  double operator()(const Point& p) const {
    const double tm = 16 << p[0], tn = 16 << p[1];
    const double warps = 2 << p[2];
    const int stages = p[3] + 1;
    const int ws = p[4];
    const int group = std::vector<int>{1, 4, 8}[static_cast<size_t>(p[5])];
    const double threads = warps * 32 + (ws ? 128 : 0);
    const double regs = tm * tn / (warps * 32) + 40;
    if (regs > 255) return kFailed;                                     // does not compile
    const double smem = stages * (tm + tn) * 64 * 2;
    if (smem > 227 * 1024) return kFailed;                              // exceeds shared memory
    const double programs = std::ceil(M / tm) * std::ceil(N / tn);
    const int per_sm = std::max(1, std::min(static_cast<int>(2048 / threads), static_cast<int>(227 * 1024 / smem)));
    const double slots = 132.0 * per_sm;
    const double waves = std::ceil(programs / slots);
    const double quant = waves * slots / programs;
    const double reuse = tm * tn / (tm * tn + overhead * (tm + tn));
    double t = M * N / reuse * quant / 1e6;
    t *= 1 + 0.35 / stages;                                             // latency hiding
    if (regs > 168) t *= 1.6;                                           // spills
    t *= ws ? (tm * tn >= 128 * 128 ? 0.9 : 1.06) : 1.0;
    t *= 1 + 0.04 * std::abs(group - best_group);
    t *= warps == 4 ? 1.0 : 1.03;
    uint64_t h = noise_seed;
    for (int v : p) h = h * 1000003 + static_cast<uint64_t>(v) + 1;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    t *= 1 + 0.02 * (static_cast<double>(h % 2001) / 1000.0 - 1.0);    // +-2% measurement noise
    return t;
  }
};

Landscape random_landscape(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Landscape l;
  const int64_t ms[] = {512, 1024, 3000, 4096, 8192};
  l.M = ms[rng() % 5];
  l.N = ms[rng() % 5];
  l.overhead = 8 + static_cast<double>(rng() % 64);
  l.best_group = std::vector<int>{1, 4, 8}[rng() % 3];
  l.noise_seed = rng();
  return l;
}

}  // namespace

// ---------------------------------------------------------------------------------- spaces

TEST_CASE("autotune space: derived from the kernel, bounded by the problem") {
  // vector_add: one block, used only by rank-1 tiles: 16..1024 for n >= 1024; no pipeline.
  {
    const Kernel& k = kernels::vector_add();
    ir::Function f = k.trace(kernels::find("vector_add").arguments({DType::f32, {}, {1 << 20}, false}));
    ConfigSpace s = derive_space(f);
    const Dimension* n = find_dim(s, "n");
    REQUIRE(n);
    CHECK(n->values == std::vector<int64_t>{16, 32, 64, 128, 256, 512, 1024});
    CHECK(find_dim(s, "num_warps")->values == std::vector<int64_t>{2, 4, 8});
    CHECK(find_dim(s, "num_stages") == nullptr);
    // The SIMT path's vector width (no pattern lowering takes vector_add); 4, the streaming
    // default's for f32 (codegen/simt_config.h), is one of them.
    CHECK(find_dim(s, "simt_vec")->values == std::vector<int64_t>{1, 4, 8});
    CHECK(s.size() == 21 * 3);
    CHECK(s.base() == default_config(f));
    CHECK(untuned_config(f, "sm_90a").knob("simt_vec", 1) == 4);
    // A tiny problem bounds the block by its extent.
    ir::Function small = k.trace(kernels::find("vector_add").arguments({DType::f32, {}, {40}, false}));
    CHECK(find_dim(derive_space(small), "n")->values == std::vector<int64_t>{16, 32, 64});
    ir::Function tiny = k.trace(kernels::find("vector_add").arguments({DType::f32, {}, {5}, false}));
    ConfigSpace ts = derive_space(tiny);
    CHECK(find_dim(ts, "n") == nullptr);   // one value: folded into the base config
    CHECK(ts.base().blocks.at("n") == 8);
  }
  // attention: m and n size rank-2 tiles: at most 256; the inner loop loads: num_stages.
  {
    const auto& e = kernels::find("attention");
    ir::Function f = e.get().trace(e.arguments({DType::e4m3, {}, {4, 16, 4096, 128}, false}));
    ConfigSpace s = derive_space(f);
    CHECK(find_dim(s, "m")->values == std::vector<int64_t>{16, 32, 64, 128, 256});
    CHECK(find_dim(s, "n")->values == std::vector<int64_t>{16, 32, 64, 128, 256});
    CHECK(find_dim(s, "num_stages")->values == std::vector<int64_t>{1, 2, 3, 4});
    CHECK(find_dim(s, "simt_vec")->values == std::vector<int64_t>{1, 4, 8});
    CHECK(find_dim(s, "warp_specialize")->values == std::vector<int64_t>{0, 1});   // the generic tensor-core lowering's
    // and persistent, raster_group, longest_first, wg_turns, overlap {0, 1, 2}, pin_waits (two dots), fp8_key_order (e4m3 V
    // is copied K-major)
    CHECK(find_dim(s, "pin_waits")->values == std::vector<int64_t>{0, 1});
    CHECK(find_dim(s, "fp8_key_order")->values == std::vector<int64_t>{0, 1});
    CHECK(s.size() == 5 * 5 * 3 * 4 * 3 * 2 * 2 * 2 * 2 * 2 * 3 * 2 * 2);
    CHECK(s.describe().find("= 345600 points") != std::string::npos);
    // Every point is a config the kernel accepts, and maps back to itself.
    for (const Point& p : all_points(s.sizes())) {
      Config c = s.config_at(p);
      CHECK_NOTHROW(check_config(f, c));
      CHECK(s.point_of(c) == p);
      CHECK(Config::from_json(c.to_json()) == c);
    }
    auto extents = constant_block_extents(f);
    CHECK(extents.size() == 2);
    CHECK(extents[0] == 4096);
    CHECK(extents[1] == 4096);
  }
  // causal attention: the inner extent depends on the outer tile: unknown, still bounded.
  {
    const auto& e = kernels::find("attention");
    ir::Function f = e.get().trace(e.arguments({DType::bf16, {}, {1, 2, 128, 64}, true}));
    auto extents = constant_block_extents(f);
    CHECK(extents[0] == 128);
    CHECK(extents[1] == -1);
    ConfigSpace s = derive_space(f);
    CHECK(find_dim(s, "m")->values == std::vector<int64_t>{16, 32, 64, 128});
    CHECK(find_dim(s, "n")->values == std::vector<int64_t>{16, 32, 64, 128, 256});
  }
}

TEST_CASE("autotune space: knobs registered by a lowering") {
  const auto& e = kernels::find("attention");
  ir::Function f = e.get().trace(e.arguments({DType::e4m3, {}, {1, 2, 256, 64}, false}));
  codegen::register_knob_provider("test-lowering", [](const ir::Function& fn, const std::string& arch) {
    std::vector<Knob> out;
    if (arch == "sm_90a" && fn.name == "attention") {
      out.push_back(Knob{"test_split", {0, 1}, 0});
      out.push_back(Knob{"test_group", {1, 4, 8}, 1});
    }
    return out;
  });
  SpaceOptions o90, o80;
  o90.arch = "sm_90a";
  o80.arch = "sm_80";
  ConfigSpace s = derive_space(f, o90);
  ConfigSpace s80 = derive_space(f, o80);
  codegen::unregister_knob_provider("test-lowering");
  ConfigSpace after = derive_space(f, o90);

  REQUIRE(find_dim(s, "test_split"));
  CHECK(find_dim(s, "test_group")->values == std::vector<int64_t>{1, 4, 8});
  CHECK(s.size() == after.size() * 6);
  CHECK(find_dim(s80, "test_split") == nullptr);
  CHECK(find_dim(after, "test_split") == nullptr);
  // The generic tensor-core lowering's own knobs, on sm_90a only.
  for (const char* k : {"warp_specialize", "persistent", "raster_group", "longest_first"}) {
    CAPTURE(std::string(k));
    CHECK(find_dim(after, k) != nullptr);
    CHECK(find_dim(s80, k) == nullptr);
  }
  // Knobs at their fallback stay out of the config: the default point prints as the default.
  Config base = s.config_at(s.point_of(default_config(f)));
  CHECK(base.knobs.empty());
  Point p = s.point_of(default_config(f));
  p.back() = 2;   // test_group 8
  Config c = s.config_at(p);
  CHECK(c.knobs.at("test_group") == 8);
  CHECK(c.to_json().find("\"test_group\":8") != std::string::npos);
  CHECK(Config::from_json(c.to_json()) == c);
  CHECK(s.point_of(Config::from_json(c.to_json())) == p);
}

TEST_CASE("autotune space: simt_vec only for kernels the SIMT path generates") {
  const auto& e = kernels::find("attention_fp8");
  ir::Function f = e.get().trace(e.arguments({DType::e4m3, {}, {1, 2, 1024, 128}, false}));
  SpaceOptions o90, o80;
  o90.arch = "sm_90a";   // the tensor-core lowering takes it
  o80.arch = "sm_80";    // its SIMT path
  CHECK(find_dim(derive_space(f, o90), "simt_vec") == nullptr);
  REQUIRE(find_dim(derive_space(f, o80), "simt_vec"));
  CHECK(find_dim(derive_space(f, o80), "simt_vec")->values == std::vector<int64_t>{1, 4, 8});
}

TEST_CASE("autotune space: restricted by hand (--only)") {
  const auto& e = kernels::find("attention");
  ir::Function f = e.get().trace(e.arguments({DType::e4m3, {}, {1, 2, 1024, 64}, false}));
  SpaceOptions o;
  parse_only("num_warps=4", o);
  parse_only("m=64,128", o);
  parse_only("num_stages=3", o);
  ConfigSpace s = derive_space(f, o);
  CHECK(find_dim(s, "m")->values == std::vector<int64_t>{64, 128});
  CHECK(find_dim(s, "num_warps") == nullptr);
  CHECK(s.base().num_warps == 4);
  CHECK(s.base().num_stages == 3);
  // m, n, simt_vec, warp_specialize, persistent, raster_group, longest_first, wg_turns, overlap, pin_waits, fp8_key_order
  CHECK(s.size() == 2 * 5 * 3 * 2 * 2 * 2 * 2 * 2 * 3 * 2 * 2);
  SpaceOptions bad;
  CHECK_THROWS_AS(parse_only("m=", bad), Error);
  CHECK_THROWS_AS(parse_only("m=12x", bad), Error);
  CHECK_THROWS_AS(parse_only("=4", bad), Error);
  parse_only("no_such_knob=1", bad);
  CHECK_THROWS_WITH_AS(derive_space(f, bad), doctest::Contains("not a block or knob"), Error);
}

// ---------------------------------------------------------------------------------- search

TEST_CASE("autotune search: exhaustive finds the optimum of a synthetic landscape") {
  Landscape l;
  int calls = 0;
  BatchCost cost = [&](const std::vector<Point>& pts) {
    ++calls;
    std::vector<double> out;
    for (const Point& p : pts) out.push_back(l(p));
    return out;
  };
  double best = kFailed;
  Point best_p;
  for (const Point& p : all_points(l.sizes))
    if (l(p) < best) best = l(p), best_p = p;
  SearchOptions ex;
  ex.strategy = Strategy::exhaustive;
  SearchResult r = search(l.sizes, cost, ex);
  CHECK(r.strategy == Strategy::exhaustive);
  CHECK(r.best == best_p);
  CHECK(r.best_cost == best);
  CHECK(r.evaluations == 1800);
  CHECK(calls == 1);   // one batch: the tuner compiles it all in parallel
  // automatic: small spaces go exhaustive.
  SearchOptions small;
  small.exhaustive_limit = 12;
  SearchResult a = search({3, 4}, [](const std::vector<Point>& pts) { return std::vector<double>(pts.size(), 1.0); }, small);
  CHECK(a.strategy == Strategy::exhaustive);
  CHECK(a.evaluations == 12);
}

TEST_CASE("autotune search: pattern search reaches within 3% of the optimum on large spaces") {
  // 40 random landscapes of 1800 points each, with cliffs, infeasible regions, wave
  // quantization and noise. The seeds are what the tuner uses: the default-like point and
  // two heuristics.
  int within = 0, exact = 0, total_evals = 0;
  double worst = 1.0;
  const int instances = 40;
  for (int i = 0; i < instances; ++i) {
    Landscape l = random_landscape(1000 + i);
    double best = kFailed;
    for (const Point& p : all_points(l.sizes)) best = std::min(best, l(p));
    std::set<Point> seen;
    bool repeated = false;
    BatchCost cost = [&](const std::vector<Point>& pts) {
      std::vector<double> out;
      for (const Point& p : pts) {
        repeated |= !seen.insert(p).second;
        out.push_back(l(p));
      }
      return out;
    };
    SearchOptions o;
    o.strategy = Strategy::pattern;
    o.seeds = {{2, 2, 1, 1, 0, 0}, {3, 3, 2, 1, 0, 0}, {1, 1, 1, 1, 0, 0}};
    o.random_samples = 16;
    o.starts = 3;
    o.max_evaluations = 250;
    o.seed = static_cast<uint64_t>(i + 1);
    SearchResult r = search(l.sizes, cost, o);
    CHECK_FALSE(repeated);
    CHECK(r.evaluations <= 250);
    total_evals += r.evaluations;
    double ratio = r.best_cost / best;
    worst = std::max(worst, ratio);
    within += ratio <= 1.03;
    exact += ratio == 1.0;
  }
  MESSAGE(fmt::format("pattern search: {}/{} within 3% ({} exact), worst {:.4f}, {:.0f} evaluations on average of 1800 points",
                      within, instances, exact, worst, double(total_evals) / instances));
  CHECK(within == instances);
  CHECK(total_evals / instances < 1800 / 6);
}

TEST_CASE("autotune search: budget, stop and failed points") {
  Landscape l;
  int evaluated = 0;
  BatchCost cost = [&](const std::vector<Point>& pts) {
    evaluated += static_cast<int>(pts.size());
    std::vector<double> out;
    for (const Point& p : pts) out.push_back(p[0] == 4 ? kFailed : l(p));
    return out;
  };
  SearchOptions o;
  o.strategy = Strategy::pattern;
  o.max_evaluations = 30;
  SearchResult r = search(l.sizes, cost, o);
  CHECK(r.evaluations <= 30);
  CHECK(evaluated == r.evaluations);
  CHECK(std::isfinite(r.best_cost));
  CHECK(r.best[0] != 4);

  int batches = 0;
  o.max_evaluations = 1000;
  o.stop = [&] { return ++batches >= 2; };
  SearchResult s = search(l.sizes, cost, o);
  CHECK(s.stopped);
  CHECK(s.batches <= 2);

  // Everything fails: no best.
  SearchResult none = search({3, 3}, [](const std::vector<Point>& pts) { return std::vector<double>(pts.size(), kFailed); },
                             SearchOptions{});
  CHECK(none.best.empty());
  CHECK_FALSE(std::isfinite(none.best_cost));
}

// ---------------------------------------------------------------------------------- keys

TEST_CASE("autotune keys: shape buckets and kernel fingerprints") {
  CHECK(bucket_dim(1) == 1);
  CHECK(bucket_dim(128) == 128);
  CHECK(bucket_dim(200) == 200);
  CHECK(bucket_dim(256) == 256);
  CHECK(bucket_dim(257) == 512);
  CHECK(bucket_dim(3000) == 4096);
  CHECK(bucket_dim(4096) == 4096);
  CHECK(bucket_dim(4097) == 8192);
  CHECK(bucket_dim(-1) == -1);

  DeviceIdentity dev{"NVIDIA H100 80GB HBM3", 9, 0, "sm_90a", 13000, 13000};
  const auto& e = kernels::find("attention");
  auto key = [&](std::vector<int64_t> shape, DType dt, bool causal) {
    return tuning_key(e.get(), e.arguments({dt, {}, shape, causal}), false, dev);
  };
  TuningKey a = key({4, 16, 4096, 128}, DType::e4m3, false);
  TuningKey b = key({4, 16, 3000, 128}, DType::e4m3, false);
  TuningKey c = key({4, 16, 8192, 128}, DType::e4m3, false);
  TuningKey d = key({4, 16, 4096, 64}, DType::e4m3, false);
  TuningKey causal = key({4, 16, 4096, 128}, DType::e4m3, true);
  TuningKey bf16 = key({4, 16, 4096, 128}, DType::bf16, false);
  CHECK(a == b);                        // same bucket
  CHECK(a.bucket == "4x16x4096x128,4x16x4096x128,4x16x4096x128,4x16x4096x128");
  CHECK(a.dtypes == "e4m3,e4m3,e4m3,bf16");
  CHECK(a.device == "NVIDIA H100 80GB HBM3 (cc 9.0)");
  CHECK(a.toolkit == "nvrtc 13000, driver 13000");
  CHECK(a.str() != c.str());
  CHECK(a.fingerprint != d.fingerprint);   // head dim is exact
  CHECK(a.fingerprint != causal.fingerprint);
  CHECK(a.fingerprint != bf16.fingerprint);
  CHECK(a.fingerprint.size() == 32);
  // Stable: the same trace gives the same fingerprint (it is a hash of the printed IR).
  CHECK(key({4, 16, 4096, 128}, DType::e4m3, false).fingerprint == a.fingerprint);
  // Dynamic shapes: the fingerprint of the dynamic trace, the bucket of the concrete shape.
  const auto& sm = kernels::find("softmax");
  TuningKey dyn1 = tuning_key(sm.get(), sm.arguments({DType::f32, {}, {100, 3000}, false}), true, dev);
  TuningKey dyn2 = tuning_key(sm.get(), sm.arguments({DType::f32, {}, {100, 5000}, false}), true, dev);
  TuningKey stat = tuning_key(sm.get(), sm.arguments({DType::f32, {}, {100, 3000}, false}), false, dev);
  CHECK(dyn1.bucket == "dyn:100x4096,100x4096");
  CHECK(dyn1.fingerprint == dyn2.fingerprint);
  CHECK(dyn1.bucket != dyn2.bucket);
  CHECK(dyn1.fingerprint != stat.fingerprint);
}

// ---------------------------------------------------------------------------------- cache

namespace {
TuningEntry entry(const std::string& name, int64_t block, double ms) {
  TuningEntry e;
  e.key = TuningKey{name, runtime::content_hash(name), "GPU (cc 9.0)", "1024", "f32", "nvrtc 13000, driver 13000"};
  e.config.blocks["n"] = block;
  e.config.num_warps = 8;
  e.config.knobs["raster_group"] = 4;
  e.ms = ms;
  e.default_ms = 2 * ms;
  e.shape = "1000";
  e.effort = "full";
  e.candidates = 17;
  return e;
}
}  // namespace

TEST_CASE("autotune cache: round trip, replace, remove") {
  fs::path dir = scratch_dir("cache");
  fs::path file = dir / "sub" / "tuning.json";
  TuningCache cache(file);
  CHECK_FALSE(cache.lookup(entry("a", 64, 1.0).key));
  CHECK(cache.entries().empty());
  uint64_t gen = tuning_generation();
  cache.store(entry("a", 64, 1.5));
  cache.store(entry("b", 128, 0.25));
  CHECK(tuning_generation() > gen);
  CHECK(fs::exists(file));

  TuningCache again(file);   // as another process would see it
  auto a = again.lookup(entry("a", 0, 0).key);
  REQUIRE(a);
  CHECK(a->config == entry("a", 64, 1.5).config);
  CHECK(a->ms == 1.5);
  CHECK(a->default_ms == 3.0);
  CHECK(a->shape == "1000");
  CHECK(a->effort == "full");
  CHECK(a->candidates == 17);
  CHECK(a->created > 0);
  CHECK(again.entries().size() == 2);

  cache.store(entry("a", 256, 0.5));   // replaces
  auto a2 = again.lookup(entry("a", 0, 0).key);
  REQUIRE(a2);
  CHECK(a2->config.blocks.at("n") == 256);
  CHECK(again.entries().size() == 2);
  // Another GPU, toolkit or bucket is another key.
  TuningKey other = entry("a", 0, 0).key;
  other.toolkit = "nvrtc 12080, driver 12080";
  CHECK_FALSE(again.lookup(other));
  CHECK(cache.remove(entry("a", 0, 0).key));
  CHECK_FALSE(cache.remove(entry("a", 0, 0).key));
  CHECK_FALSE(again.lookup(entry("a", 0, 0).key));
  CHECK(again.lookup(entry("b", 0, 0).key));
  // No temporary files are left behind.
  for (const auto& f : fs::directory_iterator(file.parent_path()))
    CHECK(f.path().filename().string().find(".tmp.") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("autotune cache: a store that cannot write says so and returns false") {
  fs::path dir = scratch_dir("unwritable");
  fs::create_directories(dir);
  const fs::path blocker = dir / "a_file";
  std::ofstream(blocker) << "not a directory";
  TuningCache cache(blocker / "tuning.json");   // its directory would be a regular file
  StderrCapture err;
  CHECK_FALSE(cache.store(entry("a", 64, 1.0)));
  CHECK(err.text().find("cannot write tuning cache " + (blocker / "tuning.json").string()) != std::string::npos);
  CHECK(TuningCache(dir / "ok.json").store(entry("a", 64, 1.0)));
  fs::remove_all(dir);
}

TEST_CASE("autotune cache: corrupt and stale files are reported and ignored") {
  fs::path dir = scratch_dir("corrupt");
  fs::path file = dir / "tuning.json";
  TuningCache cache(file);
  cache.store(entry("a", 64, 1.0));
  std::string good;
  {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    good = ss.str();
  }
  SUBCASE("truncated") {
    std::ofstream(file, std::ios::trunc) << good.substr(0, good.size() / 2);
    StderrCapture err;
    CHECK_FALSE(TuningCache(file).lookup(entry("a", 0, 0).key));
    CHECK(err.text().find("ignoring corrupt tuning cache " + file.string()) != std::string::npos);
  }
  SUBCASE("garbage") {
    std::ofstream(file, std::ios::trunc | std::ios::binary) << std::string("\x00\x01garbage\xff", 10);
    StderrCapture err;
    CHECK(TuningCache(file).entries().empty());
    CHECK(err.text().find("ignoring corrupt tuning cache") != std::string::npos);
  }
  SUBCASE("another format version") {
    std::string v2 = good;
    v2.replace(v2.find("\"version\": 1"), 12, "\"version\": 99");
    std::ofstream(file, std::ios::trunc) << v2;
    StderrCapture err;
    CHECK_FALSE(TuningCache(file).lookup(entry("a", 0, 0).key));
    CHECK(err.text().find("ignoring stale tuning cache") != std::string::npos);
  }
  SUBCASE("an entry with a bad config") {
    std::string bad = good;
    bad.replace(bad.find("\"num_warps\": 8"), 14, "\"num_warps\": \"eight\"");
    std::ofstream(file, std::ios::trunc) << bad;
    StderrCapture err;
    CHECK_FALSE(TuningCache(file).lookup(entry("a", 0, 0).key));
    CHECK(err.text().find("ignoring stale tuning cache entry") != std::string::npos);
  }
  SUBCASE("an entry whose name does not match its fields (edited by hand)") {
    std::string bad = good;
    bad.replace(bad.find("\"dtypes\": \"f32\""), 15, "\"dtypes\": \"f16\"");
    std::ofstream(file, std::ios::trunc) << bad;
    StderrCapture err;
    CHECK_FALSE(TuningCache(file).lookup(entry("a", 0, 0).key));
    CHECK(err.text().find("does not match its fields") != std::string::npos);
  }
  // The next store replaces the bad file with a good one.
  {
    StderrCapture err;
    cache.store(entry("b", 32, 1.0));
  }
  CHECK(TuningCache(file).lookup(entry("b", 0, 0).key));
  fs::remove_all(dir);
}

TEST_CASE("autotune cache: two processes storing at once keep every entry") {
  fs::path dir = scratch_dir("concurrent");
  fs::path file = dir / "tuning.json";
  constexpr int kPerProcess = 25;
  pid_t children[2];
  for (int c = 0; c < 2; ++c) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      TuningCache cache(file);
      for (int i = 0; i < kPerProcess; ++i) cache.store(entry(fmt::format("p{}_{}", c, i), 16 << (i % 5), 1.0 + i));
      ::_exit(0);
    }
    children[c] = pid;
  }
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  TuningCache cache(file);
  StderrCapture err;
  auto all = cache.entries();
  CHECK(err.text().empty());
  CHECK(all.size() == 2 * kPerProcess);
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < kPerProcess; ++i) {
      auto e = cache.lookup(entry(fmt::format("p{}_{}", c, i), 0, 0).key);
      REQUIRE(e);
      CHECK(e->ms == 1.0 + i);
    }
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------- worker

TEST_CASE("autotune worker: its CUDA kernels compile with NVRTC") {
  runtime::CompileOptions o;
  o.arch = "sm_90a";
  o.want_ptx = true;
  auto r = runtime::compile_cuda(worker_kernels_source(), "tj_worker.cu", o);
  CHECK_FALSE(r.cubin.empty());
  for (const char* entry : {"tj_compare", "tj_fault_illegal_address", "tj_fault_hang"})
    CHECK(r.ptx.find(entry) != std::string::npos);
  o.arch = "sm_80";
  CHECK_NOTHROW(runtime::compile_cuda(worker_kernels_source(), "tj_worker.cu", o));
}

TEST_CASE("autotune worker: the tilejit executable is found next to the library") {
  std::string exe = find_worker_executable();
  MESSAGE("worker executable: " << exe);
  REQUIRE_FALSE(exe.empty());
  CHECK(fs::path(exe).filename() == "tilejit");
  // A process worker answers, and reports death and hangs instead of taking the caller down.
  ScopedEnv sim("TILEJIT_TUNE_SIMULATE", "1");
  ProcessBench w(exe);
  w.start();
  WorkerReply hello = w.call(R"({"op":"hello"})", 30);
  REQUIRE(hello.ok);
  CHECK(hello.line.find("Simulated GPU") != std::string::npos);
  WorkerReply crash = w.call(R"({"op":"bench","id":1,"cubin_b64":"f0VMRg==","fault":3})", 30);
  CHECK_FALSE(crash.ok);
  CHECK(crash.failure.find("signal") != std::string::npos);
  CHECK_FALSE(w.running());
  w.start();
  WorkerReply hang = w.call(R"({"op":"bench","id":2,"cubin_b64":"f0VMRg==","fault":2})", 0.5);
  CHECK_FALSE(hang.ok);
  CHECK(hang.timed_out);
  CHECK_FALSE(w.running());
  w.start();
  CHECK(w.call(R"({"op":"hello"})", 30).ok);
  CHECK(w.starts() == 3);
  w.stop();
  CHECK_FALSE(w.running());
}

// ---------------------------------------------------------------------------------- tuner

TEST_CASE("autotune tuner: the whole pipeline against a simulated GPU worker") {
  ScopedEnv sim("TILEJIT_TUNE_SIMULATE", "1");
  fs::path dir = scratch_dir("tuner");
  const auto& e = kernels::find("softmax");
  auto specs = e.arguments({DType::f32, {}, {64, 500}, false});

  TuneOptions o;
  o.effort = Effort::full;
  o.cache_file = (dir / "tuning.json").string();
  o.progress = false;
  o.space.max_block_1d = 128;   // keep the compiles few on a CPU-only machine
  o.space.only["simt_vec"] = {1};
  std::vector<Candidate> seen;
  o.on_candidate = [&](const Candidate& c) { seen.push_back(c); };
  TuneResult r = tune(e.get(), specs, o);
  {
    std::map<std::string, int> n;
    for (const auto& c : r.candidates) ++n[std::string(name(c.status))];
    std::string counts;
    for (const auto& [k, v] : n) counts += fmt::format(" {} {}", v, k);
    MESSAGE(fmt::format("{}: {} candidates:{}; {} NVRTC compiles; {:.2f} s", r.space, r.candidates.size(), counts,
                        r.nvrtc_compiles, r.seconds));
  }

  // The simulated GPU is fastest at blocks of 128 and 8 warps.
  CHECK(r.best.blocks.at("c") == 128);
  CHECK(r.best.blocks.at("c2") == 128);
  CHECK(r.best.num_warps == 8);
  CHECK(r.best_ms == doctest::Approx(0.5));
  // The reference is the untuned config: the SIMT path's streaming one (rows of 500 in one block of
  // 512, 2 warps: codegen/simt_config.h).
  CHECK(r.reference_config == untuned_config(e.get().trace(specs), "sm_90a"));
  CHECK(r.reference_config.blocks.at("c") == 512);
  CHECK(r.reference_ms == doctest::Approx(tj::autotune::detail::simulated_ms(r.reference_config.to_json())));
  CHECK(r.reference_ms == doctest::Approx(0.9));
  CHECK(r.device.name == "Simulated GPU");
  CHECK(r.isolated);
  CHECK(r.stored);
  CHECK_FALSE(r.from_cache);
  CHECK(r.space_size == 5 * 5 * 3 * 4);   // blocks 16..128 and the untuned whole row (512) each
  CHECK(r.strategy == Strategy::pattern);   // full: exhaustive only up to 128 points
  CHECK(seen.size() == r.candidates.size());
  // num_stages does not change the SIMT code: those candidates are duplicates, never compiled or run twice.
  int dup = 0, ok = 0;
  for (const auto& c : r.candidates) {
    dup += c.status == Candidate::Status::duplicate;
    ok += c.status == Candidate::Status::ok;
  }
  CHECK(dup > 0);
  CHECK(ok > 0);
  CHECK(r.candidates.front().reference);

  // Stored and found again without running anything.
  TuneResult again = tune(e.get(), specs, o);
  CHECK(again.from_cache);
  CHECK(again.best == r.best);
  CHECK(again.candidates.empty());
  auto stored = TuningCache(o.cache_file).lookup(r.key);
  REQUIRE(stored);
  CHECK(stored->config == r.best);
  fs::remove_all(dir);
}

TEST_CASE("autotune tuner: faulting, hanging and crashing candidates are contained") {
  ScopedEnv sim("TILEJIT_TUNE_SIMULATE", "1");
  fs::path dir = scratch_dir("faults");
  const auto& e = kernels::find("vector_add");
  auto specs = e.arguments({DType::f32, {}, {2048}, false});
  TuneOptions o;
  o.effort = Effort::exhaustive;
  o.cache_file = (dir / "tuning.json").string();
  o.progress = false;
  o.candidate_timeout_s = 2;
  o.space.max_block_1d = 256;
  o.space.only["simt_vec"] = {1};   // keep the compiles few on a CPU-only machine
  for (int fault : {1, 2, 3}) {
    Config c = default_config(e.get().trace(specs));
    c.knobs[knob_names::fault] = fault;
    o.extra_candidates.push_back(c);
  }
  TuneResult r = tune(e.get(), specs, o);
  std::map<int64_t, Candidate::Status> status;
  for (const auto& c : r.candidates)
    if (c.config.knobs.count(knob_names::fault)) status[c.config.knobs.at(knob_names::fault)] = c.status;
  CHECK(status[1] == Candidate::Status::fault);     // illegal address: the worker reported it and left
  CHECK(status[2] == Candidate::Status::timeout);   // hang: killed after the timeout
  CHECK(status[3] == Candidate::Status::fault);     // crash: the worker died
  CHECK(r.worker_starts == 4);                      // one fresh worker after each
  // The tuning went on: every point of the space was measured, and the winner is right.
  int ok = 0;
  for (const auto& c : r.candidates) ok += c.status == Candidate::Status::ok;
  // blocks 16..256 and the untuned 1024 (above the cap: codegen/simt_config.h) x
  // 3 warp counts, and the untuned reference itself (simt_vec 4, outside the restricted space)
  CHECK(ok == 6 * 3 + 1);
  CHECK(r.best.blocks.at("n") == 128);
  CHECK(r.best.num_warps == 8);
  CHECK_FALSE(r.best.knobs.count(knob_names::fault));
  fs::remove_all(dir);
}

TEST_CASE("autotune tuner: effort none and bad problems") {
  const auto& e = kernels::find("vector_add");
  TuneOptions none;
  none.effort = Effort::none;
  TuneResult r = tune(e.get(), e.arguments({DType::f32, {}, {1000}, false}), none);
  CHECK(r.best == untuned_config(e.get().trace(e.arguments({DType::f32, {}, {1000}, false})), "sm_90a"));
  CHECK(r.candidates.empty());
  auto dyn = e.arguments({DType::f32, {}, {1000}, false});
  std::get<TensorSpec>(dyn[0]).shape = {-1};
  CHECK_THROWS_WITH_AS(tune(e.get(), dyn, none), doctest::Contains("concrete"), Error);
  // The library's specs compile in the unit stride of contiguous tensors, which the workers time
  // on; any other compiled-in stride could not run there.
  CHECK(std::get<TensorSpec>(e.arguments({DType::f32, {}, {1000}, false})[0]).strides == std::vector<int64_t>{1});
  auto strided = e.arguments({DType::f32, {}, {1000}, false});
  std::get<TensorSpec>(strided[1]).strides = {2};
  CHECK_THROWS_WITH_AS(tune(e.get(), strided, none),
                       "tune 'vector_add': a tensor spec [1000] compiles in stride 2 for dim 0, but the tuner runs on "
                       "contiguous tensors (stride 1 there)",
                       Error);
  CHECK(effort_from_name("quick") == Effort::quick);
  CHECK_FALSE(effort_from_name("fast"));
  CHECK(output_tolerance(DType::e4m3) == doctest::Approx(0.13));
  CHECK(output_tolerance(DType::f32) == doctest::Approx(1e-4));
}

TEST_CASE("autotune tuner: a budget that ends before any candidate ran still measures one") {
  ScopedEnv sim("TILEJIT_TUNE_SIMULATE", "100");
  fs::path dir = scratch_dir("budget_tiny");
  const auto& e = kernels::find("softmax");
  auto specs = e.arguments({DType::f32, {}, {32, 1000}, false});
  TuneOptions o;
  o.effort = Effort::exhaustive;
  o.time_budget_s = 0.01;   // over before the first compile ends
  o.cache_file = (dir / "tuning.json").string();
  o.progress = false;
  o.space.max_block_1d = 64;
  TuneResult r = tune(e.get(), specs, o);
  int ok = 0;
  for (const auto& c : r.candidates) ok += c.status == Candidate::Status::ok;
  CHECK(ok >= 1);
  CHECK(r.stored);
  fs::remove_all(dir);
}

TEST_CASE("autotune tuner: the time budget ends the search") {
  ScopedEnv sim("TILEJIT_TUNE_SIMULATE", "100");   // 100 ms per benchmark
  fs::path dir = scratch_dir("budget");
  const auto& e = kernels::find("softmax");
  auto specs = e.arguments({DType::f32, {}, {32, 1000}, false});
  TuneOptions o;
  o.effort = Effort::exhaustive;
  o.time_budget_s = 1.0;
  o.cache_file = (dir / "tuning.json").string();
  o.progress = false;
  o.space.max_block_1d = 64;
  TuneResult r = tune(e.get(), specs, o);
  int skipped = 0, ok = 0;
  for (const auto& c : r.candidates) {
    skipped += c.status == Candidate::Status::skipped;
    ok += c.status == Candidate::Status::ok;
  }
  MESSAGE(fmt::format("budget 1 s: {:.2f} s, {} ok, {} skipped of {}", r.seconds, ok, skipped, r.candidates.size()));
  CHECK(skipped > 0);
  CHECK(ok >= 1);
  CHECK(r.seconds < 10);
  bool noted = false;
  for (const auto& n : r.notes) noted |= n.find("time budget") != std::string::npos;
  CHECK(noted);
  CHECK(r.stored);   // the best so far is still worth keeping
  fs::remove_all(dir);
}
