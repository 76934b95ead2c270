// Generated CUDA, run on the CPU: the kernel source from codegen::generate_cuda and the
// embedded device library are compiled as host C++ with a small shim for the CUDA builtins
// they use (threadIdx, blockIdx, __syncthreads as a barrier of one std::thread per CUDA
// thread, __shfl_xor_sync through memory), loaded with dlopen, launched program by program
// with the same argument packing as cuLaunchKernel, and compared with run_reference.
// This checks the generator's numerics without a GPU. Needs a host C++20 compiler
// ($TILEJIT_TEST_CXX, $CXX or c++); without one the tests print SKIPPED.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention_backward.h"
#include "dsl/config.h"
#include "codegen/cuda_emitter.h"
#include "codegen/device_library.h"
#include "codegen/lowering.h"
#include "dsl/kernel.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_variants.h"
#include "kernels/library.h"
#include "core/numerics.h"
#include "runtime/reference.h"
#include "examples/kernels/user_kernels.h"

namespace tj_codegen_test {   // tests/test_codegen.cpp
const tj::Kernel& k_elementwise2d();
const tj::Kernel& k_reductions();
const tj::Kernel& k_matmul();
const tj::Kernel& k_integers();
const tj::Kernel& k_mixed_ranks();
const tj::Kernel& k_running_columns();
const tj::Kernel& k_masked_store();
const tj::Kernel& k_masked_scalar();
const tj::Kernel& k_int_reductions();
const tj::Kernel& k_atomic_add();
}  // namespace tj_codegen_test

using namespace tj;
using namespace tj_codegen_test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kShim = R"shim(// CUDA builtins for running generated kernels on the host (tests/test_codegen_emulated.cpp).
#pragma once
#include <barrier>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>
struct tj_emu_uint3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local tj_emu_uint3 threadIdx, blockIdx;
inline tj_emu_uint3 gridDim, blockDim;
inline std::barrier<>* tj_emu_barrier = nullptr;
alignas(16) inline unsigned char tj_emu_smem[256 * 1024];
template <class T> inline T tj_emu_lanes[1024];
inline void __syncthreads() { tj_emu_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { tj_emu_barrier->arrive_and_wait(); }   // (stronger: the block)
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  const unsigned t = threadIdx.x;
  tj_emu_lanes<T>[t] = v;
  tj_emu_barrier->arrive_and_wait();
  T r = tj_emu_lanes<T>[t ^ lane_mask];
  tj_emu_barrier->arrive_and_wait();
  return r;
}
inline int __any_sync(unsigned, int p) {
  const unsigned t = threadIdx.x, w = t & ~31u;
  tj_emu_lanes<int>[t] = p != 0;
  tj_emu_barrier->arrive_and_wait();
  int any = 0;
  for (unsigned l = w; l < w + 32 && l < blockDim.x; ++l) any |= tj_emu_lanes<int>[l];
  tj_emu_barrier->arrive_and_wait();
  return any;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int __float2int_rz(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 2147483647.0f) return 2147483647;
  if (x <= -2147483648.0f) return (-2147483647 - 1);
  return (int)x;
}
inline long long __float2ll_rz(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 9.2233720368547758e18f) return 9223372036854775807LL;
  if (x <= -9.2233720368547758e18f) return (-9223372036854775807LL - 1);
  return (long long)x;
}
inline float __expf(float x) { return std::exp(x); }
// Atomic adds (the DSL's atomic_add): the block's threads run at once, so under a lock.
#include <mutex>
inline std::mutex tj_emu_atomic;
inline float atomicAdd(float* p, float x) { std::lock_guard<std::mutex> g(tj_emu_atomic); const float o = *p; *p = o + x; return o; }
inline int atomicAdd(int* p, int x) {
  std::lock_guard<std::mutex> g(tj_emu_atomic);
  const int o = *p;
  *p = (int)((unsigned)o + (unsigned)x);
  return o;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long x) {
  std::lock_guard<std::mutex> g(tj_emu_atomic);
  const unsigned long long o = *p;
  *p = o + x;
  return o;
}
inline float __logf(float x) { return std::log(x); }
#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __launch_bounds__(...)
#define __shared__
#define __align__(x)
#define tj_smem tj_emu_smem
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
alignas(1024) inline unsigned char tj_emu_smem_base[256 * 1024];   // tensor-core kernels' (tj_smem is theirs)
#define tj_smem_base tj_emu_smem_base
template <class T>
inline T __shfl_sync(unsigned, T v, int src_lane) {
  const unsigned t = threadIdx.x;
  tj_emu_lanes<T>[t] = v;
  tj_emu_barrier->arrive_and_wait();
  T r = tj_emu_lanes<T>[(t & ~31u) + ((unsigned)src_lane & 31u)];
  tj_emu_barrier->arrive_and_wait();
  return r;
}
// The warp collectives of mma_sync.cuh, by the PTX ISA's fragment layouts.
#include <cstring>
#include "fp8.cuh"
inline const void* tj_emu_rows[1024];
inline unsigned tj_emu_frags[1024][6];
// ldmatrix: lanes 8i..8i+7 give matrix i's rows; lane l gets row l/4, bytes 4(l%4).. of each
// (.trans: the 16-bit elements (2(l%4), l/4) and (2(l%4)+1, l/4)).
inline void tj_host_ldmatrix(unsigned* r, int count, bool trans, const void* row) {
  const unsigned t = threadIdx.x, w = t & ~31u, l = t & 31u;
  tj_emu_rows[t] = row;
  tj_emu_barrier->arrive_and_wait();
  for (int i = 0; i < count; ++i) {
    if (!trans) {
      std::memcpy(&r[i], static_cast<const unsigned char*>(tj_emu_rows[w + 8 * i + l / 4]) + 4 * (l % 4), 4);
    } else {
      unsigned short e[2];
      for (int h = 0; h < 2; ++h)
        std::memcpy(&e[h], static_cast<const unsigned char*>(tj_emu_rows[w + 8 * i + 2 * (l % 4) + h]) + 2 * (l / 4), 2);
      r[i] = e[0] | (unsigned)e[1] << 16;
    }
  }
  tj_emu_barrier->arrive_and_wait();
}
// Element `e` of a fragment word of type t (frag.cuh's WgType: e4m3 0, e5m2 1, bf16 2, f16 3).
inline double tj_emu_element(int t, unsigned word, int e) {
  if (t >= 2) {
    const unsigned short h = (unsigned short)(word >> (16 * e));
    return t == 2 ? tj::dev::bf16_to_f32_sw(h) : tj::dev::f16_to_f32_sw(h);
  }
  const unsigned char b = (unsigned char)(word >> (8 * e));
  return t == 0 ? tj::dev::e4m3_to_f32_sw(b) : tj::dev::e5m2_to_f32_sw(b);
}
// mma.sync m16n8k16 (16-bit) / m16n8k32 (fp8): A (row, k) sits in lane 4 (row % 8) + (k % H) / P,
// register row / 8 + 2 (k / H), element k % P; B (k, n) in lane 4 n + (k % H) / P, register
// k / H (H = K / 2, P elements per register); D (lane l, c) is (l / 4 + 8 (c / 2), 2 (l % 4) + c % 2).
inline void tj_host_mma_m16n8(int ta, int tb, float* d, const unsigned* a, const unsigned* b) {
  const unsigned t = threadIdx.x, w = t & ~31u, l = t & 31u;
  std::memcpy(tj_emu_frags[t], a, 16);
  std::memcpy(tj_emu_frags[t] + 4, b, 8);
  tj_emu_barrier->arrive_and_wait();
  const int K = ta >= 2 ? 16 : 32, H = K / 2, P = ta >= 2 ? 2 : 4;
  for (int c = 0; c < 4; ++c) {
    const int row = (int)l / 4 + 8 * (c / 2), col = 2 * ((int)l % 4) + c % 2;
    double sum = 0;
    for (int k = 0; k < K; ++k) {
      const double x = tj_emu_element(ta, tj_emu_frags[w + 4 * (row % 8) + (k % H) / P][row / 8 + 2 * (k / H)], k % P);
      const double y = tj_emu_element(tb, tj_emu_frags[w + 4 * col + (k % H) / P][4 + k / H], k % P);
      sum += x * y;
    }
    d[c] = (float)((double)d[c] + sum);
  }
  tj_emu_barrier->arrive_and_wait();
}
)shim";

std::string host_compiler() {
  for (const char* var : {"TILEJIT_TEST_CXX", "CXX"})
    if (const char* v = std::getenv(var); v && *v) return v;
  return "c++";
}

// Whether the host compiler builds C++20 with <barrier>; cached.
const std::string& compiler_problem() {
  static const std::string problem = [] {
    fs::path dir = fs::temp_directory_path() / fmt::format("tilejit_emu_probe_{}", getpid());
    fs::create_directories(dir);
    std::ofstream(dir / "probe.cpp") << "#include <barrier>\nstd::barrier<> b(1);\nint main() { b.arrive_and_wait(); }\n";
    std::string cmd = fmt::format("{} -std=c++20 -pthread {} -o {} > {} 2>&1", host_compiler(), (dir / "probe.cpp").string(),
                                  (dir / "probe").string(), (dir / "log").string());
    int rc = std::system(cmd.c_str());
    fs::remove_all(dir);
    return rc == 0 ? std::string() : fmt::format("no host C++20 compiler ('{}' failed)", host_compiler());
  }();
  return problem;
}

#define TJ_REQUIRE_HOST_COMPILER()                                                              \
  do {                                                                                          \
    if (!compiler_problem().empty()) {                                                          \
      const std::string tj_msg_ = "SKIPPED: emulated codegen test: " + compiler_problem();      \
      MESSAGE(tj_msg_);                                                                         \
      std::cerr << tj_msg_ << std::endl;                                                        \
      return;                                                                                   \
    }                                                                                           \
  } while (0)

// A generated kernel compiled for the host and loaded.
class EmulatedKernel {
 public:
  using Launch = void (*)(void** params, long long programs);

  EmulatedKernel(const codegen::GeneratedKernel& g, const ir::Function& f) {
    dir_ = fs::temp_directory_path() / fmt::format("tilejit_emu_{}_{}_{}", getpid(), g.entry, counter()++);
    fs::create_directories(dir_);
    for (const auto& h : codegen::device_library()) std::ofstream(dir_ / h.name) << h.contents;
    std::ofstream(dir_ / "tj_emu_shim.h") << kShim;
    std::ofstream(dir_ / "kernel.cu") << g.source;
    std::string call = g.entry + "(";
    for (size_t p = 0; p < f.params.size(); ++p) {
      const ir::Param& prm = f.params[p];
      call += p ? ", " : "";
      if (prm.is_tensor()) call += fmt::format("*static_cast<tj::dev::TensorArg<{}>*>(params[{}])", prm.rank(), p);
      else if (prm.kind == ir::ParamKind::scalar_f32) call += fmt::format("*static_cast<float*>(params[{}])", p);
      else call += fmt::format("*static_cast<long long*>(params[{}])", p);
    }
    if (g.persistent) call += fmt::format("{}programs", f.params.empty() ? "" : ", ");   // tj_programs
    call += ")";
    // A persistent kernel's grid: knob persistent_blocks' blocks (else one per program).
    const std::string blocks = g.persistent && g.max_blocks > 0 ? fmt::format("std::min(programs, {}LL)", g.max_blocks) : "programs";
    std::ofstream(dir_ / "launch.cpp") << fmt::format(R"(#include "tj_emu_shim.h"
#include "kernel.cu"
#include <algorithm>
// One std::thread per CUDA thread; they run the blocks one after another.
extern "C" void tj_emu_launch(void** params, long long programs) {{
  const int threads = {threads};
  const long long blocks = {blocks};
  std::barrier<> bar(threads);
  tj_emu_barrier = &bar;
  gridDim.x = (unsigned)blocks;
  blockDim.x = threads;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {{
      threadIdx.x = t;
      for (long long b = 0; b < blocks; ++b) {{
        blockIdx.x = (unsigned)b;
        {call};
        bar.arrive_and_wait();
      }}
    }});
  for (auto& th : pool) th.join();
}}
)",
                                                      fmt::arg("threads", g.threads), fmt::arg("call", call), fmt::arg("blocks", blocks));
    const fs::path lib = dir_ / "kernel.so";
    std::string cmd = fmt::format("cd {} && {} -std=c++20 -O1 -w -fPIC -shared -pthread -I. launch.cpp -o {} > build.log 2>&1",
                                  dir_.string(), host_compiler(), lib.string());
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "build.log");
      std::stringstream ss;
      ss << log.rdbuf();
      throw std::runtime_error("host compilation of the generated kernel failed:\n" + ss.str().substr(0, 6000) +
                               "\n--- generated source ---\n" + g.source);
    }
    handle_ = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    launch_ = reinterpret_cast<Launch>(dlsym(handle_, "tj_emu_launch"));
    if (!launch_) throw std::runtime_error("tj_emu_launch not found");
  }
  ~EmulatedKernel() {
    if (handle_) dlclose(handle_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  EmulatedKernel(const EmulatedKernel&) = delete;
  EmulatedKernel& operator=(const EmulatedKernel&) = delete;

  void operator()(void** params, long long programs) const { launch_(params, programs); }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  fs::path dir_;
  void* handle_ = nullptr;
  Launch launch_ = nullptr;
};

// A host tensor: its bytes, its view, and the TensorArg<R> words a launch passes.
struct HostTensor {
  TensorView view;
  std::vector<unsigned char> bytes;
  std::vector<int64_t> words;   // data pointer, shape[R], stride[R]
};

// Inputs random (normal floats, small integers, random bits), outputs filled with -777 (so
// elements a kernel does not store compare equal). `strided` lays every tensor out with a
// gap after each element and each row.
HostTensor make_tensor(DType t, const std::vector<int64_t>& shape, bool output, bool strided, std::mt19937& rng) {
  HostTensor h;
  h.view.dtype = t;
  h.view.shape = shape;
  int64_t storage = 1;
  for (int64_t d : shape) storage *= d;
  if (strided) {
    h.view.strides.resize(shape.size());
    int64_t s = 2;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      h.view.strides[d] = s;
      s *= shape[d] + (d + 1 == static_cast<int>(shape.size()) ? 0 : 1);
    }
    storage = s;
  }
  h.bytes.assign(static_cast<size_t>(storage * size_bytes(t)), 0);
  std::normal_distribution<double> normal(0.0, 1.5);
  for (int64_t i = 0; i < storage; ++i) {
    double x = output ? -777.0 : is_int(t) ? std::floor(normal(rng) * 15) : t == DType::i1 ? double(normal(rng) > 0) : normal(rng);
    numerics::store_element(h.bytes.data(), t, i, x);
  }
  h.view.data = h.bytes.data();
  return h;
}

void pack(HostTensor& h) {
  h.words.clear();
  h.words.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(h.bytes.data())));
  for (int64_t d : h.view.shape) h.words.push_back(d);
  for (int64_t s : h.view.effective_strides()) h.words.push_back(s);
}

struct EmuCase {
  std::string name;
  const Kernel& (*kernel)();
  std::vector<ArgSpec> specs;
  std::string config;                              // JSON, or "untuned": untuned_config's
  std::vector<std::vector<int64_t>> shapes = {};   // actual tensor shapes (for dynamic specs)
  bool strided = false;
  const char* arch = "sm_90a";
  const char* lowering = "simt";   // the lowering the generated code must come from
  std::vector<std::vector<double>> values = {};   // a non-empty entry i: tensor i's elements
};

// Generates, emulates and compares every output element with the reference executor.
void run_case(const EmuCase& c) {
  CAPTURE(c.name);
  ir::Function f = c.kernel().trace(c.specs);
  Config cfg = c.config == "untuned" ? codegen::untuned_config(f, c.arch) : Config::from_json(c.config);
  CAPTURE(cfg.to_json());
  codegen::GeneratedKernel g = codegen::generate_cuda(f, cfg, codegen::Target::parse(c.arch));
  INFO("generated source:\n", g.source);
  CHECK(g.lowering == c.lowering);
  EmulatedKernel emu(g, f);

  std::mt19937 rng(1234);
  std::vector<HostTensor> ref, out;
  std::vector<size_t> param_of;   // parameter index of each tensor
  std::vector<ArgValue> ref_args, emu_args;
  std::vector<float> scalars;
  scalars.reserve(c.specs.size());
  size_t tensor = 0;
  for (const ArgSpec& s : c.specs) {
    if (const auto* t = std::get_if<TensorSpec>(&s)) {
      const ir::Param& p = f.params.at(ref_args.size());
      std::vector<int64_t> shape = c.shapes.empty() ? t->shape : c.shapes.at(tensor);
      ++tensor;
      param_of.push_back(ref_args.size());
      ref.push_back(make_tensor(t->dtype, shape, p.kind == ir::ParamKind::tensor_out, c.strided, rng));
      if (tensor - 1 < c.values.size() && !c.values[tensor - 1].empty()) {
        REQUIRE(!c.strided);
        for (size_t e = 0; e < c.values[tensor - 1].size(); ++e)
          numerics::store_element(ref.back().bytes.data(), t->dtype, static_cast<int64_t>(e), c.values[tensor - 1][e]);
      }
      ref_args.emplace_back(ref.back().view);
      emu_args.emplace_back(ref.back().view);   // replaced below by the copies' views
    } else if (const auto* r = std::get_if<RuntimeScalar>(&s)) {
      ref_args.emplace_back(r->value);
      emu_args.emplace_back(r->value);
    }
  }
  out = ref;   // same contents, own buffers
  std::vector<void*> params;
  size_t ti = 0;
  for (size_t a = 0; a < emu_args.size(); ++a) {
    if (std::holds_alternative<TensorView>(emu_args[a])) {
      HostTensor& h = out[ti++];
      h.view.data = h.bytes.data();
      pack(h);
      emu_args[a] = h.view;
      params.push_back(h.words.data());
    } else {
      scalars.push_back(std::get<float>(emu_args[a]));
      params.push_back(&scalars.back());
    }
  }
  for (auto& h : ref) h.view.data = h.bytes.data();
  for (size_t a = 0, i = 0; a < ref_args.size(); ++a)
    if (std::holds_alternative<TensorView>(ref_args[a])) ref_args[a] = ref[i++].view;

  run_reference(f, cfg, ref_args);
  LaunchShape ls = launch_shape(f, cfg, emu_args);
  emu(params.data(), ls.programs);

  for (size_t i = 0; i < ref.size(); ++i) {
    const ir::Param& p = f.params[param_of[i]];
    if (!p.writes()) continue;
    const DType t = ref[i].view.dtype;
    const int64_t n = static_cast<int64_t>(ref[i].bytes.size()) / size_bytes(t);
    // f32: summation order and fma differ from the reference; narrower types: one unit in
    // the last place of the output format.
    // Integers and booleans: exactly.
    const bool exact = is_int(t) || t == DType::i1;
    const double rtol = exact ? 0 : t == DType::f32 ? 3e-5 : t == DType::f16 ? 1.5e-3 : t == DType::bf16 ? 8e-3 : 0.07;
    double scale = 0;
    for (int64_t e = 0; e < n; ++e) scale = std::max(scale, std::abs(numerics::load_element(ref[i].bytes.data(), t, e)));
    int bad = 0;
    for (int64_t e = 0; e < n; ++e) {
      const double want = numerics::load_element(ref[i].bytes.data(), t, e);
      const double got = numerics::load_element(out[i].bytes.data(), t, e);
      const bool ok = exact ? got == want
                            : (std::isnan(want) && std::isnan(got)) || std::abs(got - want) <= rtol * std::abs(want) + 1e-6 * scale;
      if (!ok && bad++ < 5)
        FAIL_CHECK(fmt::format("output '{}' element {}: generated code gives {}, the reference {}", p.name, e, got,
                               want));
    }
    CHECK_MESSAGE(bad == 0, fmt::format("output '{}': {} of {} elements differ", p.name, bad, n));
  }
}

TensorSpec T(DType t, std::vector<int64_t> shape) { return TensorSpec{t, std::move(shape)}; }

const Kernel& attention() { return kernels::attention(); }
const Kernel& softmax() { return kernels::softmax(); }
const Kernel& vector_add() { return kernels::vector_add(); }
const Kernel& rmsnorm() { return kernels::rmsnorm(); }
const Kernel& layernorm() { return kernels::layernorm(); }
const Kernel& readme_attention() { return examples::readme_attention(); }
const Kernel& readme_attention_vt() { return examples::readme_attention_vt(); }
const Kernel& grouped_gemm() { return examples::grouped_gemm(); }
const Kernel& attention_bwd_dkdv() { return kernels::attention_bwd_dkdv(); }
const Kernel& attention_bwd_dq() { return kernels::attention_bwd_dq(); }
// Variants' backward kernels (kernels/attention_backward.h): hooks on the transposed scores.
const kernels::VariantBackward& alibi_backward() {
  static const kernels::VariantBackward b = kernels::attention_variant_backward(kernels::alibi_variant(2, true));
  return b;
}
const kernels::VariantBackward& window_backward() {
  static const kernels::VariantBackward b = kernels::attention_variant_backward(kernels::sliding_window_variant(24));
  return b;
}
const Kernel& alibi_bwd_dkdv() { return alibi_backward().dkdv; }
const Kernel& alibi_bwd_dq() { return alibi_backward().dq; }
const Kernel& window_bwd_dkdv() { return window_backward().dkdv; }
const Kernel& window_bwd_dq() { return window_backward().dq; }
// Masks whose loops mask_bounds bounds: rows before 40 see no key (dQ's first query tiles and
// dK / dV's last key tiles loop zero times), a prefix-LM with its prefix per batch entry, and
// documents (their boundaries loaded from cu_seqlens), segments (floordiv of the positions).
const kernels::VariantBackward& lag_backward() {
  static const kernels::VariantBackward b = [] {
    kernels::AttentionVariant lag{"attention_emulated_lag_40"};
    lag.mask_mod = [](const kernels::ScoreIndex& at) { return at.kv + 40 <= at.q; };
    return kernels::attention_variant_backward(lag);
  }();
  return b;
}
const kernels::VariantBackward& prefix_backward() {
  static const kernels::VariantBackward b = kernels::attention_variant_backward(kernels::prefix_lm_variant());
  return b;
}
const Kernel& lag_bwd_dkdv() { return lag_backward().dkdv; }
const Kernel& lag_bwd_dq() { return lag_backward().dq; }
const kernels::VariantBackward& docs_backward() {
  static const kernels::VariantBackward b = kernels::attention_variant_backward(kernels::document_variant(3, false));
  return b;
}
const kernels::VariantBackward& segment_backward() {
  static const kernels::VariantBackward b = kernels::attention_variant_backward(kernels::segment_variant(24));
  return b;
}
const Kernel& segment_bwd_dkdv() { return segment_backward().dkdv; }
const Kernel& segment_bwd_dq() { return segment_backward().dq; }
const Kernel& docs_bwd_dkdv() { return docs_backward().dkdv; }
const Kernel& docs_bwd_dq() { return docs_backward().dq; }
const Kernel& prefix_bwd_dkdv() { return prefix_backward().dkdv; }
const Kernel& prefix_bwd_dq() { return prefix_backward().dq; }
const Kernel& window_attention() { return examples::window_attention(); }
// ALiBi with learnable slopes: the dK / dV kernel adds each program's share of their gradient.
const kernels::VariantBackward& learnable_backward() {
  static const kernels::VariantBackward b = kernels::attention_variant_backward(kernels::learnable_alibi_variant(true));
  return b;
}
const Kernel& learnable_bwd_dkdv() { return learnable_backward().dkdv; }
const Kernel& attention_bwd_fused() { return kernels::attention_bwd_fused(); }
const Kernel& splitk_gemm() { return examples::splitk_gemm(); }

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16, e4m3 = DType::e4m3;

}  // namespace

TEST_CASE("codegen (emulated): attention matches the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  const std::vector<int64_t> s70{1, 2, 70, 32}, s64{1, 2, 64, 32};
  run_case({"bf16 causal, ragged", &attention, {T(bf16, s70), T(bf16, s70), T(bf16, s70), T(bf16, s70), RuntimeScalar{0.25f}, true},
            R"({"blocks":{"m":32,"n":16},"num_warps":4})"});
  run_case({"e4m3 in, bf16 out", &attention, {T(e4m3, s64), T(e4m3, s64), T(e4m3, s64), T(bf16, s64), RuntimeScalar{0.25f}, false},
            R"({"blocks":{"m":32,"n":32},"num_warps":4})"});
  run_case({"f32, warps across the rows' columns", &attention,
            {T(f32, s70), T(f32, s70), T(f32, s70), T(f32, s70), RuntimeScalar{0.2f}, true},
            R"({"blocks":{"m":16,"n":64},"num_warps":8})"});
}

TEST_CASE("codegen (emulated): softmax and vector_add match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  run_case({"softmax bf16 -> f32", &softmax, {T(bf16, {5, 333}), T(f32, {5, 333})}, R"({"blocks":{"c":128,"c2":64},"num_warps":2})"});
  run_case({"vector_add f16, dynamic, strided", &vector_add, {T(f16, {-1}), T(f16, {-1}), T(f16, {-1})},
            R"({"blocks":{"n":256},"num_warps":4})", {{1000}, {1000}, {1000}}, true});
}

TEST_CASE("codegen (emulated): streaming kernels with the SIMT path's untuned config (whole rows up to 4096, 16-byte groups) match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  auto C = [](DType t, std::vector<int64_t> shape) { return contiguous_spec(t, std::move(shape)); };
  // Rows of 3000: one ragged block of 4096; rows of 9000: three trips of 4096, the last one
  // ragged; rows of 40: one block of 64 on 2 warps.
  run_case({"softmax bf16, 1 ragged trip", &softmax, {C(bf16, {3, 3000}), C(bf16, {3, 3000})}, "untuned"});
  run_case({"softmax bf16, 3 trips", &softmax, {C(bf16, {2, 9000}), C(bf16, {2, 9000})}, "untuned"});
  run_case({"softmax f32, short rows", &softmax, {C(f32, {6, 40}), C(f32, {6, 40})}, "untuned"});
  run_case({"rmsnorm bf16", &rmsnorm, {C(bf16, {4, 1000}), C(bf16, {1000}), C(bf16, {4, 1000}), RuntimeScalar{1e-5f}}, "untuned"});
  run_case({"layernorm f16 -> f32", &layernorm,
            {C(f16, {3, 777}), C(f16, {777}), C(f16, {777}), C(f32, {3, 777}), RuntimeScalar{1e-5f}}, "untuned"});
  run_case({"vector_add f16, dynamic", &vector_add, {T(f16, {-1}), T(f16, {-1}), T(f16, {-1})}, "untuned", {{5000}, {5000}, {5000}}});
}

TEST_CASE("codegen (emulated): elementwise ops, transposes and integer tiles match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  run_case({"ew2d f32", &k_elementwise2d, {T(f32, {37, 45}), T(f32, {45, 37}), T(f32, {37, 45}), T(f32, {37, 45}), RuntimeScalar{0.75f}},
            R"({"blocks":{"r":16,"c":32}})"});
  run_case({"ew2d bf16/f16 dynamic strided", &k_elementwise2d,
            {T(bf16, {-1, -1}), T(bf16, {-1, -1}), T(f16, {-1, -1}), T(bf16, {-1, -1}), RuntimeScalar{-1.25f}},
            R"({"blocks":{"r":8,"c":64},"num_warps":2})", {{37, 45}, {45, 37}, {37, 45}, {37, 45}}, true});
  run_case({"integers", &k_integers,
            {T(DType::i32, {-1}), T(DType::i64, {-1}), T(DType::i1, {-1}), T(DType::i32, {-1}), T(DType::i64, {-1}),
             T(DType::i1, {-1}), T(f32, {-1})},
            R"({"blocks":{"n":64},"num_warps":1})", {{300}, {300}, {300}, {300}, {300}, {300}, {300}}, true});
}

// GELU's 1 + tanh(y) (rewritten into tj::dev::one_plus_tanh) beside a tanh used twice (kept), and
// stores of a cast to the output's dtype (the store rounds: no cast left).
const Kernel& k_gelu() {
  static const Kernel k = kernel("gelu", {"x", "o", "o2"}, [](In x, Out o, Out o2) {
    auto [R, C] = x.shape<2>();
    for (auto r : tile(R, block("r")))
      for (auto c : tile(C, block("c"))) {
        auto f = x.load(r, c).to(DType::f32) * 4.0;   // both tails: tanh near -1 and 1
        o.store(r, c, (f * 0.5 * (tanh((f + f * f * f * 0.044715) * 0.7978845608) + 1.0)).to(o.dtype()));
        auto t = tanh(f);
        o2.store(r, c, ((t + 1.0) * t).to(o2.dtype()));
      }
  });
  return k;
}

TEST_CASE("codegen (emulated): 1 + tanh(y) as one_plus_tanh, and stores of a cast to their dtype without the cast, match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  const char* cfg = R"({"blocks":{"r":16,"c":32},"num_warps":2})";
  for (DType out : {bf16, f32, f16}) {
    CAPTURE(name(out));
    const EmuCase c{"gelu", &k_gelu, {T(f32, {37, 45}), T(out, {37, 45}), T(bf16, {37, 45})}, cfg};
    const ir::Function f = c.kernel().trace(c.specs);
    const std::string src = codegen::generate_cuda(f, Config::from_json(cfg), codegen::Target{}).source;
    auto count = [&](const std::string& s) {
      int n = 0;
      for (size_t at = src.find(s); at != std::string::npos; at = src.find(s, at + 1)) ++n;
      return n;
    };
    CHECK(count("tj::dev::one_plus_tanh(a)") == 1);   // GELU's
    CHECK(count("tanhf(") == 1);                      // the tanh used twice
    CHECK(count("tj::dev::round_") == 0);             // both stores convert the f32 values themselves
    Config fast = Config::from_json(cfg);
    fast.knobs["fast_math"] = 1;
    const std::string fm = codegen::generate_cuda(f, fast, codegen::Target{}).source;
    CHECK(fm.find("one_plus_tanh") == std::string::npos);
    run_case(c);
  }
}

TEST_CASE("codegen (emulated): reductions, dots and mixed-rank layouts match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  run_case({"reductions, warps along the columns", &k_reductions, {T(bf16, {50, 70}), T(bf16, {50}), T(f32, {2, 70})},
            R"({"blocks":{"r":32,"c":64},"num_warps":4,"knobs":{"simt_warps_c":2}})"});
  run_case({"reductions, 8 warps", &k_reductions, {T(f32, {50, 70}), T(f32, {50}), T(f32, {4, 70})},
            R"({"blocks":{"r":16,"c":32},"num_warps":8})"});
  run_case({"matmul e4m3", &k_matmul, {T(e4m3, {40, 70}), T(e4m3, {24, 70}), T(e4m3, {70, 40}), T(f32, {40, 24}), T(bf16, {40, 24})},
            R"({"blocks":{"m":16,"n":32,"k":16},"num_warps":2})"});
  run_case({"matmul f32 dynamic strided", &k_matmul,
            {T(f32, {-1, -1}), T(f32, {-1, -1}), T(f32, {-1, -1}), T(f32, {-1, -1}), T(f16, {-1, -1})},
            R"({"blocks":{"m":64,"n":32,"k":64},"num_warps":8})", {{40, 70}, {24, 70}, {70, 40}, {40, 24}, {40, 24}}, true});
  run_case({"running columns (Vars over a named tile range)", &k_running_columns, {T(f32, {3, 70, 45}), T(f32, {3, 2, 45})},
            R"({"blocks":{"r":16},"num_warps":2})"});
  run_case({"mixed ranks", &k_mixed_ranks, {T(f16, {24}), T(f32, {24, 24}), T(f32, {24, 24}), T(f16, {24}), T(f32, {2})},
            R"({"num_warps":4})"});
  // bf16 outputs: stores (scalar ones too) of casts to bf16 convert the f32 values themselves
  run_case({"mixed ranks, bf16 outputs", &k_mixed_ranks, {T(bf16, {24}), T(bf16, {24, 24}), T(bf16, {24, 24}), T(bf16, {24}), T(bf16, {2})},
            R"({"num_warps":4})"});
}

TEST_CASE("codegen (emulated): integer reductions wrap like the reference executor's") {
  TJ_REQUIRE_HOST_COMPILER();
  for (DType t : {DType::i32, DType::i64})
    for (const char* config : {R"({"blocks":{"r":32,"c":16},"num_warps":4})", R"({"blocks":{"r":16,"c":32},"num_warps":8})",
                               R"({"blocks":{"r":32,"c":16},"num_warps":2,"knobs":{"simt_vec":4}})"})
      run_case({fmt::format("{} {}", name(t), config), &k_int_reductions,
                {T(t, {70, 48}), T(t, {70}), T(t, {70}), T(t, {-1, 48}), T(t, {-1, 48})}, config,
                {{70, 48}, {70}, {70}, {5, 48}, {5, 48}}});
}

TEST_CASE("codegen (emulated): masked stores leave the masked-out elements as they were") {
  TJ_REQUIRE_HOST_COMPILER();
  for (float alpha : {0.75f, -0.75f})
    run_case({fmt::format("tile, row and scalar masks, alpha {}", alpha), &k_masked_store,
              {T(bf16, {70, 45}), T(bf16, {70, 45}), T(f32, {70, 45}), T(f16, {70, 45}), RuntimeScalar{alpha}},
              R"({"blocks":{"r":32,"c":16},"num_warps":4})"});
  run_case({"tile masks, vec 4, dynamic strided", &k_masked_store,
            {T(f32, {-1, -1}), T(f32, {-1, -1}), T(bf16, {-1, -1}), T(f32, {-1, -1}), RuntimeScalar{0.5f}},
            R"({"blocks":{"r":16,"c":32},"num_warps":2,"knobs":{"simt_vec":4}})", {{37, 50}, {37, 50}, {37, 50}, {37, 50}}, true});
  run_case({"a masked scalar store", &k_masked_scalar, {T(f32, {-1}), T(f32, {-1})}, R"({"num_warps":1})", {{9}, {9}}});
}

TEST_CASE("codegen (emulated): atomic adds from every program into the same elements match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  // The outputs start poisoned (-777): an atomic add keeps what the tensor held.
  for (DType t : {f32, DType::i32, DType::i64})
    for (const char* config : {R"({"blocks":{"r":32,"c":16},"num_warps":4})", R"({"blocks":{"r":16,"c":32},"num_warps":2,"knobs":{"simt_vec":4}})"})
      run_case({fmt::format("{} {}", name(t), config), &k_atomic_add,
                {T(t, {3, 70, 45}), T(t, {70, 45}), T(t, {45}), T(t, {70, 45}), T(t, {1}), T(t, {45, 70}), T(t, {3, 45, 70})}, config});
}

TEST_CASE("codegen (emulated): vector layouts (knob simt_vec) match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  // Ragged extents (padding and replication across the vector groups), strided and dynamic
  // views (element by element), reductions and exchanges through shared memory, rank-1 slices.
  run_case({"ew2d f32, vec 4", &k_elementwise2d, {T(f32, {37, 45}), T(f32, {45, 37}), T(f32, {37, 45}), T(f32, {37, 45}), RuntimeScalar{0.75f}},
            R"({"blocks":{"r":16,"c":32},"knobs":{"simt_vec":4}})"});
  run_case({"ew2d bf16/f16 dynamic strided, vec 8", &k_elementwise2d,
            {T(bf16, {-1, -1}), T(bf16, {-1, -1}), T(f16, {-1, -1}), T(bf16, {-1, -1}), RuntimeScalar{-1.25f}},
            R"({"blocks":{"r":8,"c":64},"num_warps":2,"knobs":{"simt_vec":8}})", {{37, 45}, {45, 37}, {37, 45}, {37, 45}}, true});
  run_case({"ew2d bf16/f16 dynamic, vec 8", &k_elementwise2d,
            {T(bf16, {-1, -1}), T(bf16, {-1, -1}), T(f16, {-1, -1}), T(bf16, {-1, -1}), RuntimeScalar{-1.25f}},
            R"({"blocks":{"r":8,"c":64},"num_warps":2,"knobs":{"simt_vec":8}})", {{37, 45}, {45, 37}, {37, 45}, {37, 45}}});
  run_case({"reductions, warps along the columns, vec 2", &k_reductions, {T(bf16, {50, 70}), T(bf16, {50}), T(f32, {2, 70})},
            R"({"blocks":{"r":32,"c":64},"num_warps":4,"knobs":{"simt_warps_c":2,"simt_vec":2}})"});
  run_case({"reductions, 8 warps, vec 16", &k_reductions, {T(f32, {50, 70}), T(f32, {50}), T(f32, {4, 70})},
            R"({"blocks":{"r":16,"c":32},"num_warps":8,"knobs":{"simt_vec":16}})"});
  run_case({"matmul e4m3, vec 4", &k_matmul, {T(e4m3, {40, 70}), T(e4m3, {24, 70}), T(e4m3, {70, 40}), T(f32, {40, 24}), T(bf16, {40, 24})},
            R"({"blocks":{"m":16,"n":32,"k":16},"num_warps":2,"knobs":{"simt_vec":4}})"});
  run_case({"mixed ranks, vec 8", &k_mixed_ranks, {T(f16, {24}), T(f32, {24, 24}), T(f32, {24, 24}), T(f16, {24}), T(f32, {2})},
            R"({"num_warps":4,"knobs":{"simt_vec":8}})"});
  run_case({"softmax bf16 -> f32, vec 8", &softmax, {T(bf16, {5, 333}), T(f32, {5, 333})},
            R"({"blocks":{"c":128,"c2":64},"num_warps":2,"knobs":{"simt_vec":8}})"});
  run_case({"vector_add f16, vec 4", &vector_add, {T(f16, {1000}), T(f16, {1000}), T(f16, {1000})},
            R"({"blocks":{"n":256},"num_warps":4,"knobs":{"simt_vec":4}})"});
  run_case({"attention bf16 causal, vec 2", &attention,
            {T(bf16, {1, 2, 70, 32}), T(bf16, {1, 2, 70, 32}), T(bf16, {1, 2, 70, 32}), T(bf16, {1, 2, 70, 32}), RuntimeScalar{0.25f}, true},
            R"({"blocks":{"m":32,"n":16},"num_warps":4,"knobs":{"simt_vec":2}})"});
  run_case({"running columns (Vars over a named tile range), vec 4", &k_running_columns, {T(bf16, {3, 70, 72}), T(f32, {3, 2, 72})},
            R"({"blocks":{"r":32},"num_warps":4,"knobs":{"simt_vec":4}})"});
  const std::vector<int64_t> x{1, 2, 100, 64};
  run_case({"chunk_amax, 8 warps, vec 8", &kernels::chunk_amax, {T(bf16, x), T(f32, {1, 2, 3})},
            R"({"blocks":{"s":32},"num_warps":8,"knobs":{"simt_vec":8}})"});
  run_case({"chunk_amax, the pipeline's config (knob simt_min_blocks)", &kernels::chunk_amax, {T(bf16, x), T(f32, {1, 2, 3})},
            kernels::chunk_amax_config().to_json()});
  run_case({"quantize_fp8_chunked, 16 lanes, vec 8", &kernels::quantize_fp8_chunked, {T(bf16, x), T(f32, {1, 2, 3}), T(e4m3, x), T(f32, {1, 2})},
            R"({"blocks":{"s2":32},"num_warps":8,"knobs":{"simt_lanes_c":16,"simt_vec":8}})"});
  run_case({"quantize_transpose_fp8_chunked, 16 lanes, vec 8", &kernels::quantize_transpose_fp8_chunked,
            {T(bf16, x), T(f32, {1, 2, 3}), T(e4m3, {1, 2, 64, 112}), T(f32, {1, 2})},
            R"({"blocks":{"s2":32},"num_warps":8,"knobs":{"simt_lanes_c":16,"simt_vec":8}})"});
}

TEST_CASE("codegen (emulated): kernels with their unit strides compiled in (as launch() specs contiguous tensors) match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  auto C = [](DType t, std::vector<int64_t> shape) { return contiguous_spec(t, std::move(shape)); };
  const std::vector<int64_t> x{1, 2, 100, 64};
  run_case({"chunk_amax, the pipeline's config", &kernels::chunk_amax, {C(bf16, x), C(f32, {1, 2, 3})},
            kernels::chunk_amax_config().to_json()});
  run_case({"quantize_fp8_chunked, the pipeline's config", &kernels::quantize_fp8_chunked,
            {C(bf16, x), C(f32, {1, 2, 3}), C(e4m3, x), C(f32, {1, 2})}, kernels::chunked_quantize_config(false).to_json()});
  run_case({"quantize_transpose_fp8_chunked, the pipeline's config", &kernels::quantize_transpose_fp8_chunked,
            {C(bf16, x), C(f32, {1, 2, 3}), C(e4m3, {1, 2, 64, 112}), C(f32, {1, 2})},
            kernels::chunked_quantize_config(true).to_json()});
  run_case({"quantize_fp8_both_chunked (both copies, one read), the pipeline's config", &kernels::quantize_fp8_both_chunked,
            {C(bf16, x), C(f32, {1, 2, 3}), C(e4m3, x), C(e4m3, {1, 2, 64, 112}), C(f32, {1, 2})},
            kernels::chunked_quantize_config(true).to_json()});
  run_case({"softmax bf16 -> f32, vec 8", &softmax, {C(bf16, {5, 333}), C(f32, {5, 333})},
            R"({"blocks":{"c":128,"c2":64},"num_warps":2,"knobs":{"simt_vec":8}})"});
  run_case({"ew2d f32 (a transposed input)", &k_elementwise2d,
            {C(f32, {37, 45}), C(f32, {45, 37}), C(f32, {37, 45}), C(f32, {37, 45}), RuntimeScalar{0.75f}},
            R"({"blocks":{"r":16,"c":32}})"});
  run_case({"attention bf16 causal, ragged", &attention,
            {C(bf16, {1, 2, 70, 32}), C(bf16, {1, 2, 70, 32}), C(bf16, {1, 2, 70, 32}), C(bf16, {1, 2, 70, 32}),
             RuntimeScalar{0.25f}, true},
            R"({"blocks":{"m":32,"n":16},"num_warps":4})"});
  run_case({"matmul e4m3, vec 4", &k_matmul,
            {C(e4m3, {40, 70}), C(e4m3, {24, 70}), C(e4m3, {70, 40}), C(f32, {40, 24}), C(bf16, {40, 24})},
            R"({"blocks":{"m":16,"n":32,"k":16},"num_warps":2,"knobs":{"simt_vec":4}})"});
}

TEST_CASE("codegen (emulated): accumulator tiles stored through shared memory or transposed across quads (knob stage_stores) match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  // Rows contiguous (unit strides compiled in, as launch() specs contiguous tensors): the dots'
  // results leave in 16-byte row chunks; ragged rows and columns (a chunk across the end goes
  // element by element), bf16 and f32 outputs. (Knob value 2: staged though it costs these small
  // blocks occupancy, which the default 1 does not allow.)
  auto C = [](DType t, std::vector<int64_t> shape) { return contiguous_spec(t, std::move(shape)); };
  const char* mma = "tensor cores (mma.sync)";
  const std::vector<int64_t> s70{1, 2, 70, 64};
  // Knob value 3: 16-bit tiles transposed across each quad and stored in 16-byte row pieces (no
  // shared memory); whole, aligned tiles take the shuffles, the others the fragments' stores.
  struct StoreCase {
    EmuCase c;
    const char* store;   // the store the generated code calls
  };
  const StoreCase cases[] = {
      {{"README attention bf16 causal, ragged", &readme_attention,
        {C(bf16, s70), C(bf16, s70), C(bf16, s70), C(bf16, s70), RuntimeScalar{0.125f}, true},
        R"({"blocks":{"m":32,"n":32},"num_warps":2,"knobs":{"stage_stores":2}})", {}, false, "sm_80", mma},
       "tj::dev::store_staged<"},
      {{"matmul bf16, f32 and bf16 outputs, ragged", &k_matmul,
        {C(bf16, {40, 70}), C(bf16, {28, 70}), C(bf16, {70, 40}), C(f32, {40, 28}), C(bf16, {40, 28})},
        R"({"blocks":{"m":32,"n":16,"k":32},"num_warps":2,"knobs":{"stage_stores":2}})", {}, false, "sm_80", mma},
       "tj::dev::store_staged<"},
      {{"matmul bf16 out, whole tiles, quad-transposed", &k_matmul,
        {C(bf16, {64, 96}), C(bf16, {128, 96}), C(bf16, {96, 64}), C(f32, {64, 128}), C(bf16, {64, 128})},
        R"({"blocks":{"m":32,"n":64,"k":32},"num_warps":2,"knobs":{"stage_stores":3}})", {}, false, "sm_80", mma},
       "tj::dev::store_quads<"},
      {{"matmul bf16 out, ragged: quad-transposed where whole", &k_matmul,
        {C(bf16, {40, 70}), C(bf16, {136, 70}), C(bf16, {70, 40}), C(f32, {40, 136}), C(bf16, {40, 136})},
        R"({"blocks":{"m":32,"n":64,"k":32},"num_warps":2,"knobs":{"stage_stores":3}})", {}, false, "sm_80", mma},
       "tj::dev::store_quads<"}};
  for (const StoreCase& sc : cases) {
    const EmuCase& c = sc.c;
    CAPTURE(c.name);
    const codegen::GeneratedKernel g =
        codegen::generate_cuda(c.kernel().trace(c.specs), Config::from_json(c.config), codegen::Target::parse(c.arch));
    CHECK(g.source.find(sc.store) != std::string::npos);
    Config fragments = Config::from_json(c.config);
    fragments.knobs["stage_stores"] = 0;
    const codegen::GeneratedKernel off = codegen::generate_cuda(c.kernel().trace(c.specs), fragments, codegen::Target::parse(c.arch));
    CHECK(off.source.find("tj::dev::store_staged<") == std::string::npos);
    CHECK(off.source.find("tj::dev::store_quads<") == std::string::npos);
    run_case(c);
  }
}

TEST_CASE("codegen (emulated): dots on mma.sync (sm_80 / sm_89) match the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  const char* mma = "tensor cores (mma.sync)";
  const std::vector<int64_t> s70{1, 2, 70, 64};
  // a [M, K] and b [N, K] K-major (cp.async into their slots, ldmatrix), a2 [K, M] MN-major
  // (ldmatrix.trans; fp8: through registers); ragged edges everywhere.
  run_case({"matmul bf16, ragged", &k_matmul, {T(bf16, {40, 70}), T(bf16, {24, 70}), T(bf16, {70, 40}), T(f32, {40, 24}), T(bf16, {40, 24})},
            R"({"blocks":{"m":32,"n":16,"k":32},"num_warps":2})", {}, false, "sm_80", mma});
  run_case({"matmul f16, dynamic strided (element copies)", &k_matmul,
            {T(f16, {-1, -1}), T(f16, {-1, -1}), T(f16, {-1, -1}), T(f32, {-1, -1}), T(f16, {-1, -1})},
            R"({"blocks":{"m":64,"n":24,"k":16},"num_warps":4})", {{70, 40}, {24, 40}, {40, 70}, {70, 24}, {70, 24}}, true, "sm_80", mma});
  run_case({"matmul bf16, 3 stages", &k_matmul, {T(bf16, {40, 130}), T(bf16, {24, 130}), T(bf16, {130, 40}), T(f32, {40, 24}), T(bf16, {40, 24})},
            R"({"blocks":{"m":32,"n":16,"k":16},"num_warps":2,"num_stages":3})", {}, false, "sm_80", mma});
  run_case({"matmul bf16, 1 stage (copies where the loads stand)", &k_matmul,
            {T(bf16, {40, 70}), T(bf16, {24, 70}), T(bf16, {70, 40}), T(f32, {40, 24}), T(bf16, {40, 24})},
            R"({"blocks":{"m":32,"n":16,"k":32},"num_warps":2,"num_stages":1})", {}, false, "sm_80", mma});
  run_case({"matmul e4m3 on sm_89", &k_matmul, {T(e4m3, {40, 70}), T(e4m3, {24, 70}), T(e4m3, {70, 40}), T(f32, {40, 24}), T(bf16, {40, 24})},
            R"({"blocks":{"m":32,"n":32,"k":64},"num_warps":2})", {}, false, "sm_89", mma});
  // README attention: P as A fragments (bf16 pairs; e4m3 bytes moved across the quad).
  run_case({"README attention bf16 causal, ragged", &readme_attention,
            {T(bf16, s70), T(bf16, s70), T(bf16, s70), T(bf16, s70), RuntimeScalar{0.125f}, true},
            R"({"blocks":{"m":32,"n":32},"num_warps":2})", {}, false, "sm_80", mma});
  // Row ranges read from the GPU's memory (an empty group, tiles ending inside groups), stores
  // masked at each group's end.
  run_case({"grouped GEMM (MoE), device-scalar row ranges", &grouped_gemm,
            {T(bf16, {100, 64}), T(bf16, {4, 24, 64}), T(DType::i64, {5}), T(f32, {100, 24})},
            R"({"blocks":{"m":32,"n":16,"k":32},"num_warps":2})", {}, false, "sm_80", mma, {{}, {}, {0, 37, 37, 87, 100}, {}}});
  run_case({"README attention f16, 4 stages", &readme_attention,
            {T(f16, s70), T(f16, s70), T(f16, s70), T(bf16, s70), RuntimeScalar{0.125f}, false},
            R"({"blocks":{"m":64,"n":16},"num_warps":4,"num_stages":4})", {}, false, "sm_80", mma});
  // The attention backward: scores transposed so that P^T and dS^T feed the next dots as A
  // fragments; causal and ragged.
  const std::vector<int64_t> s80{1, 2, 80, 64}, r80{1, 2, 80};
  for (bool causal : {false, true}) {
    run_case({fmt::format("attention backward dK / dV, causal={}", causal), &attention_bwd_dkdv,
              {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80), T(bf16, s80),
               RuntimeScalar{0.1f}, causal},
              R"({"blocks":{"m":32,"n":32},"num_warps":2})", {}, false, "sm_80", mma});
    // The longest programs first: key tiles from the first (their query loops shrink along them).
    if (causal)
      run_case({"attention backward dK / dV, causal, longest first", &attention_bwd_dkdv,
                {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80), T(bf16, s80),
                 RuntimeScalar{0.1f}, causal},
                R"({"blocks":{"m":32,"n":32},"num_warps":2,"knobs":{"longest_first":1}})", {}, false, "sm_80", mma});
    run_case({fmt::format("attention backward dQ, causal={}", causal), &attention_bwd_dq,
              {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80),
               RuntimeScalar{0.1f}, causal},
              R"({"blocks":{"m":32,"n":32},"num_warps":2})", {}, false, "sm_80", mma});
  }
  // Variants' backward: ALiBi's bias (positions in the score) and a window's mask, on the transposed
  // scores of dK / dV and on dQ's, causal.
  for (auto [what, dkdv, dq] : {std::tuple{"ALiBi", &alibi_bwd_dkdv, &alibi_bwd_dq}, std::tuple{"window 24", &window_bwd_dkdv, &window_bwd_dq}})
    for (const char* knobs : {"{}", R"({"longest_first":1})"}) {
      run_case({fmt::format("variant backward {} dK / dV, knobs {}", what, knobs), dkdv,
                {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80), T(bf16, s80),
                 RuntimeScalar{0.1f}, true},
                fmt::format(R"({{"blocks":{{"m":32,"n":32}},"num_warps":2,"knobs":{}}})", knobs), {}, false, "sm_80", mma});
      run_case({fmt::format("variant backward {} dQ, knobs {}", what, knobs), dq,
                {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80), RuntimeScalar{0.1f}, true},
                fmt::format(R"({{"blocks":{{"m":32,"n":32}},"num_warps":2,"knobs":{}}})", knobs), {}, false, "sm_80", mma});
    }
  // e4m3 P: S's columns by parity (K's rows copied even rows first, knob key_parity), the causal
  // mask and the ragged tail on each register's true key; and in order with the bytes moved
  // across each quad (key_parity 0).
  for (bool causal : {false, true}) {
    run_case({fmt::format("README attention e4m3 on sm_89, causal={}", causal), &readme_attention,
              {T(e4m3, s70), T(e4m3, s70), T(e4m3, s70), T(bf16, s70), RuntimeScalar{0.125f}, causal},
              R"({"blocks":{"m":32,"n":32},"num_warps":2})", {}, false, "sm_89", mma});
    run_case({fmt::format("README attention e4m3 on sm_89, causal={}, key_parity 0", causal), &readme_attention,
              {T(e4m3, s70), T(e4m3, s70), T(e4m3, s70), T(bf16, s70), RuntimeScalar{0.125f}, causal},
              R"({"blocks":{"m":32,"n":32},"num_warps":2,"knobs":{"key_parity":0}})", {}, false, "sm_89", mma});
  }
  run_case({"README attention e4m3, V stored [D, S], on sm_89, causal, 64 keys a tile", &readme_attention_vt,
            {T(e4m3, s70), T(e4m3, s70), T(e4m3, {1, 2, 64, 70}), T(bf16, s70), RuntimeScalar{0.125f}, true},
            R"({"blocks":{"m":32,"n":64},"num_warps":2})", {}, false, "sm_89", mma});
  // Atomic adds from the accumulator fragments: a split-K GEMM's programs into one C tile (C starts
  // poisoned, -777: kept and added to), and the fused backward's dQ^T added transposed into dq_acc.
  run_case({"split-K GEMM, atomic adds of accumulator tiles", &splitk_gemm,
            {T(bf16, {40, 200}), T(bf16, {24, 200}), T(f32, {40, 24})},
            R"({"blocks":{"m":32,"n":16,"k":32,"ks":64},"num_warps":2})", {}, false, "sm_80", mma});
  run_case({"fused attention backward (dQ^T added transposed), causal", &attention_bwd_fused,
            {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80), T(bf16, s80),
             T(f32, s80), RuntimeScalar{0.1f}, true},
            R"({"blocks":{"m":32,"n":32},"num_warps":2})", {}, false, "sm_80", mma});
}

TEST_CASE("codegen (emulated): loops bounded by their masks (knob mask_bounds) match the reference executor, empty loops too") {
  TJ_REQUIRE_HOST_COMPILER();
  const char* mma = "tensor cores (mma.sync)";
  const std::vector<int64_t> s80{1, 2, 80, 64}, r80{1, 2, 80};
  const std::string blocks = R"({"blocks":{"m":16,"n":32},"num_warps":1})";
  struct Masked {
    const char* what;
    const Kernel& (*dkdv)();
    const Kernel& (*dq)();
    std::vector<int64_t> input;   // the variant's input (i32), if any
  };
  for (const Masked& m : {Masked{"rows before 40 see no key", &lag_bwd_dkdv, &lag_bwd_dq, {}},
                          Masked{"prefix-LM, prefix 37", &prefix_bwd_dkdv, &prefix_bwd_dq, {37}},
                          Masked{"documents at 0, 30, 55, 80", &docs_bwd_dkdv, &docs_bwd_dq, {0, 30, 55, 80}},
                          Masked{"segments of 24", &segment_bwd_dkdv, &segment_bwd_dq, {}}}) {
    for (bool dkdv : {true, false}) {
      std::vector<ArgSpec> a = {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80)};
      if (dkdv) a.push_back(T(bf16, s80));
      a.push_back(RuntimeScalar{0.1f});
      a.push_back(false);
      std::vector<std::vector<double>> values;
      if (!m.input.empty()) {
        a.push_back(T(DType::i32, {static_cast<int64_t>(m.input.size())}));
        values.resize(dkdv ? 9 : 8);
        values.back().assign(m.input.begin(), m.input.end());
      }
      run_case({fmt::format("{}: {}", m.what, dkdv ? "dK / dV" : "dQ"), dkdv ? m.dkdv : m.dq, a, blocks, {}, false, "sm_80", mma, values});
    }
  }
  // Learnable ALiBi slopes: their gradient (zeroed here: the reference adds into it too) summed by
  // an atomic add per program, the causal loop bounded.
  run_case({"learnable ALiBi slopes: dK / dV and the slopes' gradient", &learnable_bwd_dkdv,
            {T(bf16, s80), T(bf16, s80), T(bf16, s80), T(bf16, s80), T(f32, r80), T(f32, r80), T(bf16, s80), T(bf16, s80),
             RuntimeScalar{0.1f}, true, T(f32, {2}), T(f32, {2})},
            blocks, {}, false, "sm_80", mma, {{}, {}, {}, {}, {}, {}, {}, {}, {0.25, -0.125}, {0, 0}}});
  // A user's sliding-window forward: online softmax from the window's first key tile.
  const std::vector<int64_t> s70{1, 2, 70, 64};
  run_case({"window attention (user kernel), window 24", &window_attention,
            {T(bf16, s70), T(bf16, s70), T(bf16, s70), T(bf16, s70), RuntimeScalar{0.125f}, int64_t{24}},
            R"({"blocks":{"m":16,"n":16},"num_warps":1})", {}, false, "sm_80", mma});
  run_case({"window attention (user kernel), window 24, SIMT", &window_attention,
            {T(bf16, s70), T(bf16, s70), T(bf16, s70), T(bf16, s70), RuntimeScalar{0.125f}, int64_t{24}},
            R"({"blocks":{"m":16,"n":16},"num_warps":1,"knobs":{"mma":0}})", {}, false, "sm_80", "simt"});
}

TEST_CASE("codegen (emulated): knob longest_first runs every program once, the longest first over groups of heads") {
  TJ_REQUIRE_HOST_COMPILER();
  // 3 heads x 3 query tiles, causal: groups from the L2 budget (all 3 heads), of 2 heads (the last
  // group short) and head by head; each must cover every (head, tile) once to match.
  const DType bf16 = DType::bf16;
  const std::vector<int64_t> s{1, 3, 70, 32};
  // Persistent: 2, 4 and 5 blocks looping over the programs in that order, in rounds of 2, 3 (the
  // group's 9 programs: the fourth block idles) and 5 programs, every other round backwards (5: a
  // last round that only some blocks take).
  for (const char* group : {"", ",\"raster_group\":2", ",\"raster_group\":1", ",\"persistent\":1,\"persistent_blocks\":2",
                            ",\"persistent\":1,\"persistent_blocks\":4", ",\"persistent\":1,\"persistent_blocks\":5"}) {
    CAPTURE(group);
    const EmuCase c{"README attention bf16 causal", &readme_attention,
                    {T(bf16, s), T(bf16, s), T(bf16, s), T(bf16, s), RuntimeScalar{0.125f}, true},
                    fmt::format(R"({{"blocks":{{"m":32,"n":32}},"num_warps":2,"knobs":{{"longest_first":1{}}}}})", group),
                    {}, false, "sm_80", "tensor cores (mma.sync)"};
    const codegen::GeneratedKernel g =
        codegen::generate_cuda(c.kernel().trace(c.specs), Config::from_json(c.config), codegen::Target::parse(c.arch));
    const bool persistent = std::string(group).find("persistent") != std::string::npos;
    CHECK(g.source.find(persistent ? "attn_tile_longest_first((unsigned)tj::dev::attn_round_pid((unsigned)tj_pid, blockIdx.x, "
                                     "tj_rounds, (unsigned)tj_total)"
                                   : "attn_tile_longest_first((unsigned)tj_pid") != std::string::npos);
    CHECK(g.persistent == persistent);
    run_case(c);
  }
}

TEST_CASE("codegen (emulated): the row max of scores times a scale, as the scale times the max or min of the scores, matches the reference executor") {
  TJ_REQUIRE_HOST_COMPILER();
  // amax(dot(...) * scale): s * amax(x) for a finite s > 0, s * amin(x) for a finite s < 0,
  // amax(x * s) itself for s = 0 (and infinities, NaN). Also through the causal where (the rule on
  // tiles the mask holds on, the masked product elsewhere) and on a ragged range's last tile.
  const DType bf16 = DType::bf16;
  const std::vector<int64_t> s64{1, 2, 64, 32}, s70{1, 2, 70, 32};
  // (Each scale causal and not, one on whole tiles only, one with a ragged last tile.)
  for (float scale : {0.125f, -0.125f, 0.0f})
    for (bool causal : {false, true}) {
      const std::vector<int64_t>* shape = causal == (scale != -0.125f) ? &s70 : &s64;
      CAPTURE(scale);
      CAPTURE(causal);
      CAPTURE((*shape)[2]);
      const EmuCase c{"README attention bf16", &readme_attention,
                      {T(bf16, *shape), T(bf16, *shape), T(bf16, *shape), T(bf16, *shape), RuntimeScalar{scale}, causal},
                      R"({"blocks":{"m":32,"n":32},"num_warps":2})", {}, false, "sm_80", "tensor cores (mma.sync)"};
      const codegen::GeneratedKernel g =
          codegen::generate_cuda(c.kernel().trace(c.specs), Config::from_json(c.config), codegen::Target::parse(c.arch));
      CHECK(g.source.find("tj::dev::finite_positive(scale) ? tj::dev::times(tj::dev::reduce<tj::dev::op_max") != std::string::npos);
      CHECK(g.source.find("tj::dev::finite_positive(-(scale)) ? tj::dev::times(tj::dev::reduce<tj::dev::op_min") != std::string::npos);
      // softmax's scores - max goes through the causal mask: one expression on whole tiles
      CHECK((g.source.find("through the mask: its arm where it holds") != std::string::npos) == causal);
      run_case(c);
    }
}
