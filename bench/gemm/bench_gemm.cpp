// bench_gemm: times tilejit's fp8_gemm (e4m3, per-tensor scales, bf16 out) and bf16 gemm on the
// GPU, per shape and config, and writes one JSON line per measurement. bench/gemm/torch_bench.py
// measures torch._scaled_mm and torch.matmul the same way and merges both into one table.
//
//   bench_gemm [--out FILE.jsonl] [--shapes all|square|llm|M,N,K;...] [--reps 20] [--warmup 3]
//              [--kernels fp8,bf16] [--configs NAME,...] [--threads N] [--no-check] [--arch sm_80|sm_89|sm_90]
//              [--out-dtype bf16|f32]   (fp8_gemm's output; the bf16 gemm always writes bf16)
//              [--config NAME=JSON]...  (one more config of the --kernels given, e.g. for a sweep
//                                        beside --configs none;
//                                        a name containing "promote" reports as a promoted row)
//   bench_gemm --small          correctness on small and ragged shapes (also for compute-sanitizer)
//
// --arch: generate for that architecture instead of the GPU's own (its own config list: the
// cp.async + mma.sync lowering of codegen/lower_gemm_sm80.cpp; fp8 needs sm_89 or newer). On a
// newer GPU the kernel is loaded as PTX (tj::compile), so an H100 times the sm_80 / sm_89 code.
//
// Method (the same in torch_bench.py): inputs A [M,K] and B [N,K] (K-major) ~ N(0,1) rounded to
// the input type, scale_a = 1.25, scale_b = 0.75; each timed sample is one launch between two
// CUDA events, queued behind a spin kernel so that host launch overhead never shows; warm-up
// launches first, then the median of --reps samples; when A, B and C together fit in 3x the L2
// cache, samples rotate over enough copies of them to exceed it. TFLOP/s = 2*M*N*K / time.
// Accuracy: relative error against float64 on the dequantized inputs, on 512 sampled entries
// (plus the corners): rel_rms = ||out - ref|| / ||ref||, max_rel = max |out - ref| / (|ref| + rms).
//
// Launch: compile() (NVRTC, cached), then the kernel is launched here with its tensor maps, as
// a persistent grid of min(cluster tiles, max active clusters) clusters (the occupancy API);
// each shape's best config is also run once through tj::launch and must give identical bits.
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dsl/config.h"
#include "kernels/library.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/memory.h"
#include "core/numerics.h"
#include "runtime/nvrtc.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"
#include "bench/common/timing.h"

using namespace tj;
using tj::bench::median;
using tj::bench::Spinner;

namespace {

struct Shape {
  int64_t M, N, K;
  std::string group;   // "square" or "llm"
};

struct NamedConfig {
  std::string name;
  std::string json;
  bool promote = false;   // reported as its own row (same precision as cuBLASLt without fast accumulation)
};

const std::vector<NamedConfig>& fp8_configs() {
  static const std::vector<NamedConfig> v = {
      {"coop_128x256_c2", R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})"},
      {"coop_128x256_c1", R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":1,"promote":0}})"},
      {"coop_128x256_c2_g16", R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"raster_group":16,"promote":0}})"},
      {"coop_256x128_c2", R"({"blocks":{"m":256,"n":128,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})"},
      {"ping_128x128_c2", R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"warp_specialize":2,"promote":0}})"},
      {"ping_64x256_c2", R"({"blocks":{"m":64,"n":256,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":0}})"},
      // The promoted tiles without promotion: what promotion itself costs.
      {"coop_128x192_c2", R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":0}})"},
      {"coop_128x128_c2", R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"promote":0}})"},
      {"coop_128x128_c2_promote4", R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"promote":4}})", true},
      // Promotion every 128 elements of K (cuBLASLt's error): free at 128x128 since the promoted
      // loop is software-pipelined and overlaps the epilogue.
      {"coop_128x128_c2_promote1", R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":2,"promote":1}})", true},
      {"coop_128x192_c2_promote1", R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":1}})", true},
      {"coop_128x192_c2_promote2", R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":2}})", true},
      {"coop_128x192_c2_promote4", R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":4}})", true},
      // 128x128 without clusters: each CTA loads its own B (no multicast, no lock step with a
      // peer): at 4096^3 the fastest promoted tile (H100: 1265 vs 1170 TFLOP/s with
      // cluster 2; 5 stages ahead of 6).
      {"coop_128x128_c1_s5_promote4", R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":5,"knobs":{"cluster":1,"promote":4}})", true},
      {"coop_128x128_c1", R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":6,"knobs":{"cluster":1,"promote":0}})"},
      // The lowering's default (4 stages: the staged epilogue's buffers take shared memory too).
      {"coop_128x192_c2_s4_promote4", R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":4}})", true},
      {"coop_128x192_c2_s4", R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0}})"},
      // The accumulator layout's direct stores instead of the staged epilogue: what staging buys.
      {"coop_128x256_c2_direct", R"({"blocks":{"m":128,"n":256,"k":128},"num_stages":4,"knobs":{"cluster":2,"promote":0,"staged_store":0}})"},
      {"coop_128x192_c2_promote4_direct", R"({"blocks":{"m":128,"n":192,"k":128},"num_stages":5,"knobs":{"cluster":2,"promote":4,"staged_store":0}})", true},
  };
  return v;
}

const std::vector<NamedConfig>& bf16_configs() {
  static const std::vector<NamedConfig> v = {
      {"coop_128x256_c2", R"({"blocks":{"m":128,"n":256,"k":64},"num_stages":4,"knobs":{"cluster":2}})"},
      {"coop_128x256_c1", R"({"blocks":{"m":128,"n":256,"k":64},"num_stages":4,"knobs":{"cluster":1}})"},
      {"coop_256x128_c2", R"({"blocks":{"m":256,"n":128,"k":64},"num_stages":4,"knobs":{"cluster":2}})"},
      {"ping_128x128_c2", R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":6,"knobs":{"cluster":2,"warp_specialize":2}})"},
      {"ping_64x256_c2", R"({"blocks":{"m":64,"n":256,"k":64},"num_stages":5,"knobs":{"cluster":2}})"},
  };
  return v;
}

// Configs of the mma.sync lowering (sm_80 / sm_89 / sm_90): block m x n x k, stages, warps. The
// fp8 ones fit sm_89's 99 KB of shared memory per block.
const std::vector<NamedConfig>& fp8_configs_mma() {
  static const std::vector<NamedConfig> v = {
      {"mma_128x128x64_s4", R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":4})"},
      {"mma_128x128x128_s3", R"({"blocks":{"m":128,"n":128,"k":128},"num_stages":3})"},
      {"mma_128x256x64_s3_w8", R"({"blocks":{"m":128,"n":256,"k":64},"num_stages":3,"num_warps":8})"},
      {"mma_256x128x64_s3_w8", R"({"blocks":{"m":256,"n":128,"k":64},"num_stages":3,"num_warps":8})"},
      {"mma_128x128x64_s4_w8", R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":4,"num_warps":8})"},
  };
  return v;
}

const std::vector<NamedConfig>& bf16_configs_mma() {
  static const std::vector<NamedConfig> v = {
      {"mma_128x128x32_s4", R"({"blocks":{"m":128,"n":128,"k":32},"num_stages":4})"},
      {"mma_128x128x64_s3", R"({"blocks":{"m":128,"n":128,"k":64},"num_stages":3})"},
      {"mma_128x256x32_s3_w8", R"({"blocks":{"m":128,"n":256,"k":32},"num_stages":3,"num_warps":8})"},
      {"mma_256x128x32_s3_w8", R"({"blocks":{"m":256,"n":128,"k":32},"num_stages":3,"num_warps":8})"},
      {"mma_128x128x32_s4_w8", R"({"blocks":{"m":128,"n":128,"k":32},"num_stages":4,"num_warps":8})"},
  };
  return v;
}

// The config list for a kernel on an architecture: the wgmma lowering's on sm_90a, else the
// mma.sync lowering's.
const std::vector<NamedConfig>& configs_for(bool fp8, const std::string& arch) {
  if (arch == "sm_90a") return fp8 ? fp8_configs() : bf16_configs();
  return fp8 ? fp8_configs_mma() : bf16_configs_mma();
}

std::vector<Shape> shapes_for(const std::string& s) {
  std::vector<Shape> out;
  if (s == "all" || s == "square")
    for (int64_t n : {1024, 2048, 4096, 8192, 16384}) out.push_back({n, n, n, "square"});
  if (s == "all" || s == "llm")
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}})
      out.push_back({8192, n, k, "llm"});
  if (!out.empty()) return out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(';', pos);
    std::string part = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    int64_t m = 0, n = 0, k = 0;
    if (std::sscanf(part.c_str(), "%ld,%ld,%ld", &m, &n, &k) != 3) throw Error("bad --shapes entry '" + part + "'");
    out.push_back({m, n, k, "custom"});
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

// ---- inputs ---------------------------------------------------------------------------------

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// n elements of `t` ~ N(0,1) rounded to t: a table of 65536 samples indexed by a hash (fast
// for the 268 MB operands of 16384^3).
HostTensor random_matrix(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  static std::map<int, std::vector<uint8_t>> tables;
  std::vector<uint8_t>& table = tables[static_cast<int>(t)];
  const int es = size_bytes(t);
  if (table.empty()) {
    std::mt19937_64 rng(12345);
    std::normal_distribution<double> n(0.0, 1.0);
    table.resize(65536 * es);
    for (int i = 0; i < 65536; ++i) numerics::store_element(table.data(), t, i, n(rng));
  }
  HostTensor h(t, {rows, cols});
  uint8_t* p = static_cast<uint8_t*>(h.data());
  const int64_t n = rows * cols;
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      const int64_t lo = n * w / threads, hi = n * (w + 1) / threads;
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t r = splitmix(seed * 0x1000003ull + static_cast<uint64_t>(i)) & 0xFFFF;
        std::memcpy(p + i * es, table.data() + r * es, es);
      }
    });
  for (auto& th : pool) th.join();
  return h;
}

// ---- timing helpers -------------------------------------------------------------------------

using OccupancyClusters = CUresult (*)(int*, CUfunction, const CUlaunchConfig*);
OccupancyClusters occupancy_clusters() {
  static OccupancyClusters f = [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    return h ? reinterpret_cast<OccupancyClusters>(dlsym(h, "cuOccupancyMaxActiveClusters")) : nullptr;
  }();
  return f;
}

// ---- one GEMM problem on the device ---------------------------------------------------------

struct Problem {
  Shape shape;
  DType in = DType::e4m3;
  DType out = DType::bf16;
  bool fp8 = true;
  HostTensor a, b;                        // host copies (for the reference)
  std::vector<DeviceTensor> da, db, dc;   // rotation copies
  DeviceTensor sa{DType::f32, {1}}, sb{DType::f32, {1}}, bias{DType::f32, {0}};
  int copies = 1;
  static constexpr double kScaleA = 1.25, kScaleB = 0.75;

  Problem(const Shape& s, bool is_fp8, int64_t l2_bytes, uint64_t seed, DType out_type = DType::bf16)
      : shape(s), in(is_fp8 ? DType::e4m3 : DType::bf16), out(out_type), fp8(is_fp8),
        a(random_matrix(in, s.M, s.K, seed)), b(random_matrix(in, s.N, s.K, seed + 1)) {
    const double ws = double(a.size_bytes() + b.size_bytes()) + double(s.M * s.N * size_bytes(out));
    copies = ws < 3.0 * l2_bytes ? std::min(64, static_cast<int>(std::ceil(3.0 * l2_bytes / ws))) : 1;
    da.push_back(DeviceTensor::from_host(a));
    db.push_back(DeviceTensor::from_host(b));
    for (int i = 1; i < copies; ++i) {
      da.push_back(DeviceTensor::from_host(a));
      db.push_back(DeviceTensor::from_host(b));
    }
    for (int i = 0; i < copies; ++i) dc.emplace_back(out, std::vector<int64_t>{s.M, s.N});
    HostTensor h(DType::f32, {1});
    h.set(0, kScaleA);
    sa = DeviceTensor::from_host(h);
    h.set(0, kScaleB);
    sb = DeviceTensor::from_host(h);
  }
  const Kernel& kernel() const { return fp8 ? kernels::fp8_gemm() : kernels::gemm(); }
  std::vector<Arg> args(int copy) const {
    if (fp8) return {da[copy].view(), db[copy].view(), sa.view(), sb.view(), bias.view(), dc[copy].view()};
    return {da[copy].view(), db[copy].view(), dc[copy].view()};
  }
  std::vector<ArgSpec> specs() const { return specs_for(kernel(), args(0), false); }
  double scale() const { return fp8 ? kScaleA * kScaleB : 1.0; }
};

// The kernel's arguments packed as its signature expects (runtime/jit.cpp's ABI).
struct Packed {
  std::vector<std::vector<int64_t>> tensors;
  std::vector<CUtensorMap> maps;
  long long programs = 0;
  std::vector<void*> ptrs;
};

Packed pack(const Kernel& k, const CompiledKernel& ck, const std::vector<Arg>& args, long long programs) {
  Packed p;
  p.tensors.reserve(args.size());
  std::vector<TensorView> views;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& t = std::get<TensorView>(args[i]);
    views.push_back(t);
    std::vector<int64_t> w{static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data))};
    w.insert(w.end(), t.shape.begin(), t.shape.end());
    const auto st = t.effective_strides();
    w.insert(w.end(), st.begin(), st.end());
    p.tensors.push_back(std::move(w));
  }
  p.maps.reserve(ck.generated.tma.size());
  for (const auto& op : ck.generated.tma)
    p.maps.push_back(encode_tma(k.name(), k.slots()[op.param].name, views.at(op.param), op));
  p.programs = programs;
  for (auto& t : p.tensors) p.ptrs.push_back(t.data());
  for (auto& m : p.maps) p.ptrs.push_back(&m);
  if (ck.generated.persistent) p.ptrs.push_back(&p.programs);
  return p;
}

struct Runner {
  const CompiledKernel* ck = nullptr;
  runtime::Dim3 grid, block, cluster;
  size_t smem = 0;
  std::vector<Packed> packed;   // per rotation copy
  int max_clusters = 0;
  void launch(int copy, CUstream s) {
    runtime::launch(ck->function, grid, block, smem, s, packed[copy].ptrs.data(), cluster);
  }
};

Runner make_runner(const Problem& pr, const CompiledKernel& ck, int sm_count) {
  Runner r;
  r.ck = &ck;
  const auto& g = ck.generated;
  std::vector<ArgValue> vals;
  for (const Arg& a : pr.args(0)) vals.emplace_back(std::get<TensorView>(a));
  const int64_t programs = launch_shape(ck.ir, ck.config, vals).programs;
  const int cm = std::max(1, g.cluster_x);
  r.cluster = runtime::Dim3(static_cast<unsigned>(cm));
  r.block = runtime::Dim3(static_cast<unsigned>(g.threads));
  r.smem = g.dynamic_smem_bytes;
  int64_t blocks = programs;
  if (g.persistent) {
    int clusters = sm_count / cm;
    if (auto occ = occupancy_clusters()) {
      CUlaunchConfig lc{};
      CUlaunchAttribute attr{};
      attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr.value.clusterDim.x = cm;
      attr.value.clusterDim.y = 1;
      attr.value.clusterDim.z = 1;
      lc.gridDimX = cm * sm_count;
      lc.gridDimY = lc.gridDimZ = 1;
      lc.blockDimX = g.threads;
      lc.blockDimY = lc.blockDimZ = 1;
      lc.sharedMemBytes = static_cast<unsigned>(g.dynamic_smem_bytes);
      lc.attrs = &attr;
      lc.numAttrs = 1;
      int n = 0;
      if (occ(&n, ck.function, &lc) == CUDA_SUCCESS && n > 0) clusters = n;
    }
    r.max_clusters = clusters;
    // programs counts CTA tiles; a cluster covers cm tile rows of one tile column (at most).
    blocks = std::min<int64_t>(programs, static_cast<int64_t>(clusters) * cm);
  }
  blocks = (blocks + cm - 1) / cm * cm;
  r.grid = runtime::Dim3(static_cast<unsigned>(std::max<int64_t>(blocks, cm)));
  for (int c = 0; c < pr.copies; ++c) r.packed.push_back(pack(pr.kernel(), ck, pr.args(c), programs));
  return r;
}

struct Timing {
  double ms = 0;
  std::vector<double> samples;
};

Timing time_runner(Runner& r, Spinner& spin, const runtime::Stream& s, int copies, int warmup, int reps) {
  Timing t;
  t.samples = bench::time_samples([&](int i, CUstream st) { r.launch(i % copies, st); }, spin, s,
                                  warmup, reps, std::clamp(reps * 0.05, 2.0, 50.0));
  t.ms = median(t.samples);
  return t;
}

struct Accuracy {
  double rel_rms = 0, max_rel = 0;
  int64_t nan = 0;
  int samples = 0;
};

Accuracy check(const Problem& pr, const DeviceTensor& c, uint64_t seed) {
  const int64_t M = pr.shape.M, N = pr.shape.N, K = pr.shape.K;
  std::vector<std::pair<int64_t, int64_t>> pts = {{0, 0}, {0, N - 1}, {M - 1, 0}, {M - 1, N - 1}};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 512; ++i) pts.push_back({static_cast<int64_t>(rng() % M), static_cast<int64_t>(rng() % N)});
  // Fetch the sampled rows of C only.
  const int es = size_bytes(pr.out);
  std::vector<uint8_t> row(static_cast<size_t>(N * es));
  std::map<int64_t, std::vector<uint8_t>> rows;
  for (auto [i, j] : pts)
    if (!rows.count(i)) {
      TensorView v = c.view();
      runtime::check(runtime::driver().cuMemcpyDtoH(row.data(), reinterpret_cast<CUdeviceptr>(v.data) + i * N * es, row.size()),
                     "cuMemcpyDtoH");
      rows[i] = row;
    }
  const uint8_t* A = static_cast<const uint8_t*>(pr.a.data());
  const uint8_t* B = static_cast<const uint8_t*>(pr.b.data());
  const int ies = size_bytes(pr.in);
  std::vector<double> out, ref;
  for (auto [i, j] : pts) {
    double acc = 0;
    for (int64_t k = 0; k < K; ++k)
      acc += numerics::load_element(A + (i * K) * ies, pr.in, k) * numerics::load_element(B + (j * K) * ies, pr.in, k);
    ref.push_back(acc * pr.scale());
    out.push_back(numerics::load_element(rows[i].data(), pr.out, j));
  }
  Accuracy a;
  a.samples = static_cast<int>(pts.size());
  double r2 = 0, e2 = 0;
  for (double r : ref) r2 += r * r;
  const double rms = std::sqrt(r2 / ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) {
      ++a.nan;
      continue;
    }
    const double d = out[i] - ref[i];
    e2 += d * d;
    a.max_rel = std::max(a.max_rel, std::abs(d) / (std::abs(ref[i]) + rms));
  }
  a.rel_rms = std::sqrt(e2 / std::max(r2, 1e-300));
  return a;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\', out += ch;
    else if (ch == '\n') out += "\\n";
    else if (static_cast<unsigned char>(ch) >= 0x20) out += ch;
  }
  return out + "\"";
}

struct Options {
  std::string out = "tilejit_gemm.jsonl";
  std::string shapes = "all";
  std::vector<std::string> kernels = {"fp8", "bf16"};
  std::vector<std::string> configs;   // empty: all
  std::vector<NamedConfig> extra;     // --config NAME=JSON
  int reps = 20, warmup = 3, threads = 0;
  bool check = true;
  bool small = false;
  std::string arch;                   // empty: the GPU's own
  DType out_dtype = DType::bf16;      // fp8_gemm's output
};

DType parse_out_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "f32") return DType::f32;
  throw Error("--out-dtype takes bf16 or f32, got '" + s + "'");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t e = s.find(sep, pos);
    out.push_back(s.substr(pos, e == std::string::npos ? std::string::npos : e - pos));
    if (e == std::string::npos) break;
    pos = e + 1;
  }
  return out;
}

// Compiles every (problem, config) pair on a thread pool (NVRTC), loads nothing.
void precompile(const std::vector<std::pair<const Kernel*, std::vector<ArgSpec>>>& work, const std::vector<Config>& cfgs,
                int threads, const std::string& arch) {
  std::atomic<size_t> next{0};
  std::mutex m;
  const size_t total = work.size();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i = next++; i < total; i = next++) {
        try {
          CompileRequest req;
          req.arch = arch;
          req.load = false;
          compile(*work[i].first, work[i].second, cfgs[i], req);
        } catch (const std::exception& e) {
          std::lock_guard lock(m);
          fmt::print(stderr, "compile failed: {}: {}\n", cfgs[i].to_json(), e.what());
        }
      }
    });
  for (auto& th : pool) th.join();
  fmt::print("compiled {} kernels on {} threads in {:.1f} s\n", total, threads,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

int run_bench(const Options& o) {
  const auto& dev = runtime::current_device();
  fmt::print("device: {} ({}), {} SMs, L2 {} MB, driver {}\n", dev.name, dev.arch(), dev.sm_count, dev.l2_bytes >> 20,
             dev.driver_version);
  const std::string arch = o.arch.empty() ? dev.arch() : o.arch;
  if (arch != dev.arch()) fmt::print("generating for {} (loaded as PTX where the GPU is newer)\n", arch);
  else if (arch != "sm_90a") fmt::print("warning: not a Hopper GPU: the mma.sync path (or SIMT) runs\n");
  CompileRequest on_arch;
  on_arch.arch = arch;
  Spinner spin;
  spin.init(dev.arch());
  runtime::Stream stream;
  std::ofstream jsonl(o.out, std::ios::app);
  const std::vector<Shape> shapes = shapes_for(o.shapes);
  const int threads = o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);

  for (const std::string& kname : o.kernels) {
    const bool fp8 = kname == "fp8";
    if (!fp8 && kname != "bf16") throw Error("--kernels takes fp8 and/or bf16");
    std::vector<NamedConfig> cfgs;
    for (const auto& c : configs_for(fp8, arch))
      if (o.configs.empty() || std::find(o.configs.begin(), o.configs.end(), c.name) != o.configs.end()) cfgs.push_back(c);
    cfgs.insert(cfgs.end(), o.extra.begin(), o.extra.end());
    // Compile everything first (static shapes: one kernel per shape and config).
    {
      std::vector<std::pair<const Kernel*, std::vector<ArgSpec>>> work;
      std::vector<Config> wc;
      for (const Shape& s : shapes) {
        const DType in = fp8 ? DType::e4m3 : DType::bf16;
        // Contiguous operands, as Problem::specs() (specs_for) sees them: their unit strides compiled in.
        std::vector<ArgSpec> specs;
        if (fp8)
          specs = {contiguous_spec(in, {s.M, s.K}),         contiguous_spec(in, {s.N, s.K}),
                   contiguous_spec(DType::f32, {1}),        contiguous_spec(DType::f32, {1}),
                   contiguous_spec(DType::f32, {0}),        contiguous_spec(o.out_dtype, {s.M, s.N})};
        else
          specs = {contiguous_spec(in, {s.M, s.K}), contiguous_spec(in, {s.N, s.K}), contiguous_spec(DType::bf16, {s.M, s.N})};
        for (const auto& c : cfgs) {
          work.emplace_back(fp8 ? &kernels::fp8_gemm() : &kernels::gemm(), specs);
          wc.push_back(Config::from_json(c.json));
        }
      }
      precompile(work, wc, threads, arch);
    }
    for (const Shape& s : shapes) {
      auto t0 = std::chrono::steady_clock::now();
      Problem pr(s, fp8, dev.l2_bytes, 1000 + s.M * 7 + s.N * 13 + s.K, fp8 ? o.out_dtype : DType::bf16);
      const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
      fmt::print("\n{} {}x{}x{}: {} rotation copies (inputs {:.1f} s)\n", fp8 ? "fp8_gemm e4m3->" + std::string(name(pr.out)) : "gemm bf16", s.M, s.N,
                 s.K, pr.copies, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      struct Best {
        double ms = 1e30;
        std::string name, json;
        const CompiledKernel* ck = nullptr;
      };
      Best best, best_promote;
      for (const auto& c : cfgs) {
        const Config config = Config::from_json(c.json);
        try {
          const CompiledKernel& ck = compile(pr.kernel(), pr.specs(), config, on_arch);
          Runner r = make_runner(pr, ck, dev.sm_count);
          for (auto& d : pr.dc) d.fill_bytes(0xFF);
          Timing t = time_runner(r, spin, stream, pr.copies, o.warmup, o.reps);
          Accuracy acc;
          if (o.check) acc = check(pr, pr.dc[0], 7);
          const auto attr = runtime::Module::attributes(ck.function);
          const double tf = flops / (t.ms * 1e-3) / 1e12;
          fmt::print("  {:<26} {:9.4f} ms {:8.1f} TFLOP/s  grid {:4} (max clusters {:3})  rel_rms {:.2e} max_rel {:.2e}{}  [{}]\n",
                     c.name, t.ms, tf, r.grid.x, r.max_clusters, acc.rel_rms, acc.max_rel,
                     acc.nan ? fmt::format(" NaN {}", acc.nan) : "", ck.generated.lowering);
          jsonl << fmt::format(
                       R"({{"impl":"tilejit","arch":"{}","kernel":"{}","in":"{}","out":"{}","M":{},"N":{},"K":{},"config":"{}","promote":{},)"
                       R"("ms":{:.6f},"tflops":{:.2f},"rel_rms":{:.3e},"max_rel":{:.3e},"nan":{},"samples":{},"copies":{},)"
                       R"("grid":{},"regs":{},"lowering":"{}","config_json":{}}})",
                       arch, fp8 ? "fp8_gemm" : "gemm", fp8 ? "e4m3" : "bf16", name(pr.out), s.M, s.N, s.K, c.name, c.promote ? "true" : "false", t.ms,
                       tf, acc.rel_rms, acc.max_rel, acc.nan, acc.samples, pr.copies, r.grid.x, attr.num_regs,
                       ck.generated.lowering, c.json)
                << "\n";
          jsonl.flush();
          Best& b = c.promote ? best_promote : best;
          if (t.ms < b.ms && acc.nan == 0) b = Best{t.ms, c.name, c.json, &ck};
        } catch (const std::exception& e) {
          fmt::print("  {:<26} FAILED: {}\n", c.name, e.what());
          jsonl << fmt::format(R"({{"impl":"tilejit","kernel":"{}","M":{},"N":{},"K":{},"config":"{}","error":{}}})",
                               fp8 ? "fp8_gemm" : "gemm", s.M, s.N, s.K, c.name, json_string(std::string(e.what()).substr(0, 300)))
                << "\n";
        }
      }
      // The library path: tj::launch with the best config must give the same bits.
      if (best.ck) {
        try {
          Runner r = make_runner(pr, *best.ck, dev.sm_count);
          pr.dc[0].fill_bytes(0xFF);
          r.launch(0, stream);
          stream.synchronize();
          HostTensor mine = pr.dc[0].to_host();
          pr.dc[0].fill_bytes(0xFF);
          LaunchOptions lo;
          lo.config = Config::from_json(best.json);
          lo.arch = o.arch;
          launch(pr.kernel(), pr.args(0), lo);
          runtime::synchronize();
          HostTensor lib = pr.dc[0].to_host();
          const bool same = std::memcmp(mine.data(), lib.data(), mine.size_bytes()) == 0;
          fmt::print("  tj::launch with {}: {}\n", best.name, same ? "identical output" : "OUTPUT DIFFERS");
          jsonl << fmt::format(R"({{"impl":"tilejit","kernel":"{}","M":{},"N":{},"K":{},"tj_launch_check":"{}","config":"{}"}})",
                               fp8 ? "fp8_gemm" : "gemm", s.M, s.N, s.K, same ? "identical" : "differs", best.name)
                << "\n";
        } catch (const std::exception& e) {
          fmt::print("  tj::launch with {}: FAILED: {}\n", best.name, e.what());
          jsonl << fmt::format(R"({{"impl":"tilejit","kernel":"{}","M":{},"N":{},"K":{},"tj_launch_check":"failed"}})",
                               fp8 ? "fp8_gemm" : "gemm", s.M, s.N, s.K)
                << "\n";
        }
      }
    }
  }
  return 0;
}

// Small and ragged shapes, several configs, checked in full against float64 (and run under
// compute-sanitizer by run.sh sanitize).
int run_small(const Options& o) {
  const auto& dev = runtime::current_device();
  const std::string arch = o.arch.empty() ? dev.arch() : o.arch;
  CompileRequest on_arch;
  on_arch.arch = arch;
  runtime::Stream stream;
  int failures = 0;
  const std::vector<Shape> shapes = {{1000, 520, 784, "small"}, {256, 384, 512, "small"}, {129, 17, 48, "small"}, {64, 64, 64, "small"}};
  for (bool fp8 : {true, false}) {
    if (fp8 && arch == "sm_80") continue;   // no fp8 tensor cores: the SIMT path, too slow here
    std::vector<NamedConfig> cfgs = configs_for(fp8, arch);
    cfgs.push_back({"default", R"({"blocks":{"m":64,"n":64,"k":64}})"});
    for (const Shape& s : shapes) {
      Problem pr(s, fp8, 0, 99 + s.M);
      for (const auto& c : cfgs) {
        if (!o.configs.empty() && std::find(o.configs.begin(), o.configs.end(), c.name) == o.configs.end()) continue;
        const Config config = Config::from_json(c.json);
        const CompiledKernel& ck = compile(pr.kernel(), pr.specs(), config, on_arch);
        Runner r = make_runner(pr, ck, dev.sm_count);
        pr.dc[0].fill_bytes(0xFF);
        r.launch(0, stream);
        stream.synchronize();
        // full check
        HostTensor c_host = pr.dc[0].to_host();
        const auto av = pr.a.values(), bv = pr.b.values();
        double e2 = 0, r2 = 0;
        int64_t nan = 0;
        for (int64_t i = 0; i < s.M; ++i)
          for (int64_t j = 0; j < s.N; ++j) {
            double acc = 0;
            for (int64_t k = 0; k < s.K; ++k) acc += av[i * s.K + k] * bv[j * s.K + k];
            acc *= pr.scale();
            const double g = c_host.at(i * s.N + j);
            if (std::isnan(g)) ++nan;
            else e2 += (g - acc) * (g - acc);
            r2 += acc * acc;
          }
        const double rel = std::sqrt(e2 / std::max(r2, 1e-300));
        const bool ok = nan == 0 && rel <= 4e-3;
        failures += !ok;
        fmt::print("{} {}x{}x{} {:<26} rel_rms {:.2e} NaN {} {}\n", fp8 ? "fp8 " : "bf16", s.M, s.N, s.K, c.name, rel, nan,
                   ok ? "ok" : "FAIL");
      }
    }
  }
  fmt::print("{}\n", failures ? fmt::format("{} FAILED", failures) : "all small cases OK");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("missing value after " + a);
      return argv[++i];
    };
    try {
      if (a == "--out") o.out = next();
      else if (a == "--shapes") o.shapes = next();
      else if (a == "--reps") o.reps = std::stoi(next());
      else if (a == "--warmup") o.warmup = std::stoi(next());
      else if (a == "--threads") o.threads = std::stoi(next());
      else if (a == "--kernels") o.kernels = split(next(), ',');
      else if (a == "--configs") o.configs = split(next(), ',');
      else if (a == "--config") {
        const std::string v = next();
        const size_t eq = v.find('=');
        if (eq == std::string::npos || eq == 0) throw Error("--config takes NAME=JSON, got '" + v + "'");
        const std::string name = v.substr(0, eq);
        (void)Config::from_json(v.substr(eq + 1));   // a bad JSON fails here, before any work
        o.extra.push_back({name, v.substr(eq + 1), name.find("promote") != std::string::npos});
      }
      else if (a == "--no-check") o.check = false;
      else if (a == "--small") o.small = true;
      else if (a == "--arch") o.arch = next();
      else if (a == "--out-dtype") o.out_dtype = parse_out_dtype(next());
      else if (a == "--help" || a == "-h") {
        std::puts("bench_gemm [--out F.jsonl] [--shapes all|square|llm|M,N,K;...] [--kernels fp8,bf16] [--configs a,b]"
                  " [--reps N] [--warmup N] [--threads N] [--no-check] [--arch sm_80|sm_89|sm_90] [--out-dtype bf16|f32] [--config NAME=JSON]... | --small [--arch ...]");
        return 0;
      } else {
        throw Error("unknown argument " + a);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_gemm: %s\n", e.what());
      return 2;
    }
  }
  try {
    return o.small ? run_small(o) : run_bench(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
}
